#!/usr/bin/env bash
# Runs the examples of README.md and docs/*.md as written (ctest docs:examples, label `docs`; docs/testing.md).
#
#   scripts/doc_examples.sh BUILD_DIR [FILE.md...]     (default: README.md docs/*.md)
#
# Every ```sh or ```bash block carries a marker on the line before its fence:
#   <!-- example: run -->             run it (bash -euo pipefail) and fail when it fails
#   <!-- example: skip: REASON -->    not run, and why (it needs a VM, root, real hardware, a placeholder token...)
# and a block of another language may carry
#   <!-- example: file NAME -->       saved as NAME for the run blocks after it (a config, a trace)
# A shell block without a marker is an error, so a new example is either run or says why not.
# The blocks of one file run in order in one scratch folder that looks like the source tree (every top-level entry
# linked, `build` linking BUILD_DIR), with BUILD_DIR/bin on PATH; each may take 120 s.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:?usage: doc_examples.sh BUILD_DIR [FILE.md...]}" && pwd)
shift
if [ $# -eq 0 ]; then
  set -- "$root/README.md" "$root"/docs/*.md
fi

failed=0 ran=0 skipped=0
for md in "$@"; do
  rel=${md#"$root"/}
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/accelpool-docs.XXXXXX")
  blocks="$scratch/.blocks"
  mkdir -p "$blocks"
  # One file per fenced block (N.body) and an index line per block: N, language, line, marker.
  awk -v out="$blocks" '
    /^```/ && !inside {
      inside = 1; n++; lang = substr($0, 4); start = NR
      marker = (prev ~ /^<!-- example: .* -->$/) ? prev : ""
      sub(/^<!-- example: /, "", marker); sub(/ -->$/, "", marker)
      printf "" > (out "/" n ".body")
      next
    }
    /^```/ && inside {
      inside = 0
      printf "%d\t%s\t%d\t%s\n", n, lang, start, marker > (out "/index")
      next
    }
    inside { print > (out "/" n ".body"); next }
    NF { prev = $0 }
  ' "$md"
  for entry in "$root"/* "$root"/.[!.]*; do
    name=$(basename "$entry")
    case "$name" in build | .git | .cache) continue ;; esac
    ln -s "$entry" "$scratch/$name"
  done
  ln -s "$build" "$scratch/build"
  [ -f "$blocks/index" ] || { rm -rf "$scratch"; continue; }
  while IFS=$'\t' read -r n lang line marker; do
    where="$rel:$line"
    case "$marker" in
    run)
      if [ "$lang" != sh ] && [ "$lang" != bash ]; then
        echo "FAIL $where: 'run' marks a $lang block (only sh and bash run)"; failed=$((failed + 1)); continue
      fi
      echo "== run $where"
      if (cd "$scratch" && PATH="$build/bin:$PATH" timeout 120 bash -euo pipefail "$blocks/$n.body") \
           >"$blocks/$n.log" 2>&1; then
        ran=$((ran + 1))
        sed 's/^/   | /' "$blocks/$n.log" | tail -n 5
      else
        echo "FAIL $where: the example exits with $? (its output below)"
        sed 's/^/   | /' "$blocks/$n.log"
        failed=$((failed + 1))
      fi
      ;;
    skip:\ ?*)
      skipped=$((skipped + 1))
      ;;
    file\ ?*)
      cp "$blocks/$n.body" "$scratch/${marker#file }"
      ;;
    "")
      if [ "$lang" = sh ] || [ "$lang" = bash ]; then
        echo "FAIL $where: a shell example without a marker (<!-- example: run --> or <!-- example: skip: REASON -->)"
        failed=$((failed + 1))
      fi
      ;;
    *)
      echo "FAIL $where: unknown marker '$marker'"; failed=$((failed + 1))
      ;;
    esac
  done <"$blocks/index"
  rm -rf "$scratch"
done
echo "doc examples: $ran ran, $skipped not run (marked with their reason), $failed failed"
[ $failed -eq 0 ]

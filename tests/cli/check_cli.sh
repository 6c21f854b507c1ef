#!/usr/bin/env bash
# Checks one program's command line: `--help` exits 0 and describes --help and --version (without doing the
# program's work: HELP_ARGS go before it, e.g. a pool that does not exist), `--version` prints "NAME VERSION" and
# exits 0, an unknown option after RUN_ARGS (which satisfy the required arguments; default HELP_ARGS) exits 2
# naming it.
# Usage: check_cli.sh BIN NAME VERSION [HELP_ARGS...] [-- RUN_ARGS...]
set -u
bin=$1 name=$2 version=$3
shift 3
help_args=() run_args=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do help_args+=("$1"); shift; done
if [ $# -gt 0 ]; then shift; run_args=("$@"); else run_args=("${help_args[@]}"); fi
failed=0
check() {  # check WHAT CONDITION...
  local what=$1
  shift
  if "$@"; then echo "ok: $name $what"; else echo "FAILED: $name $what"; failed=1; fi
}

help=$("$bin" "${help_args[@]}" --help 2>&1)
rc=$?
check "--help exits 0 (got $rc)" test "$rc" -eq 0
check "--help names the program" grep -q "$name" <<<"$help"
check "--help describes --help" grep -q -- "--help" <<<"$help"
check "--help describes --version" grep -q -- "--version" <<<"$help"
check "--help says what it does (a line of prose)" grep -qE '^[a-z-]+: [a-z]' <<<"$help"

out=$("$bin" --version 2>&1)
rc=$?
check "--version exits 0 (got $rc)" test "$rc" -eq 0
check "--version prints '$name $version' (got '$out')" test "$out" = "$name $version"

err=$("$bin" "${run_args[@]}" --no-such-option 2>&1 >/dev/null)
rc=$?
check "an unknown option exits 2 (got $rc)" test "$rc" -eq 2
check "an unknown option is named" grep -q -- "--no-such-option" <<<"$err"
exit $failed

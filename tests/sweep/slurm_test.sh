#!/usr/bin/env bash
# accelpool-sweep on a real single-node Slurm: the job array's merged results equal a local run's; an array
# task cancelled before it ran leaves its cells unfinished, resubmitting runs just that slice, and the merge is
# unchanged. Usage: slurm_test.sh ACCELPOOL_SWEEP TMP_PARENT. Exit 77 (skipped) only when Slurm cannot start.
set -uo pipefail
SWEEP=$1
mkdir -p "$2"
WORK=$(mktemp -d "$2/slurm.XXXXXX")
# The daemons' folder holds Unix sockets (munge's, slurmd's steps), whose paths must stay short: under /tmp.
CLUSTER=$(mktemp -d "${TMPDIR:-/tmp}/apslurm.XXXXXX")
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=slurm_cluster.sh
source "$HERE/slurm_cluster.sh"

cleanup() {
  slurm_stop
  rm -rf "$WORK" "$CLUSTER"
}
fail() {
  echo "FAIL: $*" >&2
  for f in "$CLUSTER"/log/*.log "$WORK"/slurm/slurm/task-*.out; do
    [ -f "$f" ] && { echo "--- $f" >&2; tail -20 "$f" >&2; }
  done
  exit 1
}

slurm_start "$CLUSTER"
rc=$?
if [ $rc -ne 0 ]; then
  rm -rf "$WORK" "$CLUSTER"
  exit $rc
fi
trap cleanup EXIT

# tests/sweep/small.toml (12 cells) in 4 slices of 3 cells.
{ cat "$HERE/small.toml"; printf '[slurm]\ntasks = 4\n'; } > "$WORK/study.toml"
STUDY="$WORK/study.toml"

# The reference: the same study on this machine.
"$SWEEP" run --quiet -j 2 --study "$STUDY" --out "$WORK/local" >/dev/null || fail "local run"
"$SWEEP" merge --study "$STUDY" --out "$WORK/local" >/dev/null || fail "local merge"

# Waits (polling squeue, up to 5 minutes: only a hung cluster takes that long) until job $1 has left the queue.
wait_job() {
  slurm_wait_for "[ -z \"\$(squeue -h -j $1 2>&1)\" ]" 300 ||
    fail "job $1 still queued: $(squeue -j "$1" 2>&1)"
}

# Submit held, cancel array task 1 before it can run, release the rest.
out=$("$SWEEP" slurm --study "$STUDY" --out "$WORK/slurm" --sbatch-arg=--hold) || fail "submit: $out"
job=$(echo "$out" | tail -1)
[[ "$job" =~ ^[0-9]+$ ]] || fail "no job id in: $out"
grep -q '^#SBATCH --array=0,1,2,3$' "$WORK/slurm/slurm/array.sh" || fail "array line: $(cat "$WORK/slurm/slurm/array.sh")"
scancel "${job}_1" || fail "scancel ${job}_1"
scontrol release "$job" || fail "release $job"
wait_job "$job"

status=$("$SWEEP" status --study "$STUDY" --out "$WORK/slurm")
echo "after the first array: $status"
[ "$(echo "$status" | head -1)" = "9 done, 0 failed, 3 remaining" ] || fail "status: $status"
"$SWEEP" merge --study "$STUDY" --out "$WORK/slurm" >/dev/null 2>&1 && fail "merge accepted an unfinished study"

# Resubmit: only slice 1 runs.
out=$("$SWEEP" slurm --study "$STUDY" --out "$WORK/slurm") || fail "resubmit: $out"
job2=$(echo "$out" | tail -1)
grep -q '^#SBATCH --array=1$' "$WORK/slurm/slurm/array.sh" || fail "resubmitted array: $(grep array= "$WORK/slurm/slurm/array.sh")"
wait_job "$job2"
status=$("$SWEEP" status --study "$STUDY" --out "$WORK/slurm")
[ "$(echo "$status" | head -1)" = "12 done, 0 failed, 0 remaining" ] || fail "status after the retry: $status"
grep -q "task 1 of 4" "$WORK/slurm/slurm/task-${job2}_1.out" || fail "no output of the retried task"

"$SWEEP" merge --study "$STUDY" --out "$WORK/slurm" >/dev/null || fail "slurm merge"
for f in study.json cells.csv groups.csv plots/avg_jct.svg plots/p99_jct.svg plots/jct_cdf.svg; do
  cmp "$WORK/local/merged/$f" "$WORK/slurm/merged/$f" || fail "merged $f differs between the local run and Slurm"
done
out=$("$SWEEP" slurm --study "$STUDY" --out "$WORK/slurm") || fail "third submit: $out"
echo "$out" | grep -q "nothing to submit" || fail "a finished study was submitted again: $out"
echo "slurm sweep: jobs $job and $job2, merges equal"

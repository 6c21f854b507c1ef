#!/usr/bin/env bash
# accelpool-sweep on a real single-node Slurm: the job array's merged results equal a local run's; an array
# task cancelled before it ran leaves its cells unfinished, resubmitting runs just that slice, and the merge is
# unchanged; a task killed while it runs (after one of its cells finished) is retried, runs only the cells it
# did not finish, and the merge equals a local run's. Usage: slurm_test.sh ACCELPOOL_SWEEP TMP_PARENT. Exit 77 (skipped) only when Slurm cannot start.
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

# A task killed while it runs. Its cells read a trace file, which each cell opens once: for the Slurm run the
# file is a named pipe, so a cell can only start when the test writes the trace into it. One cell is let
# through; the task is cancelled while the second waits on the pipe. The retried task runs only the cells
# that did not finish, and the merge equals a local run's.
cp "$HERE/../../scheduler/sim/traces/philly.csv" "$WORK/trace.csv" || fail "copy the trace"
cat > "$WORK/killed.toml" <<'TOML'
policies = ["fifo", "sjf"]
loads = [0.9]
devices = [32]
estimates = ["oracle"]
seeds = 2
[[traces]]
name = "philly-week"
file = "trace.csv"
format = "philly"
window_s = [0, 604800]
[slurm]
tasks = 1
TOML
KILLED="$WORK/killed.toml"
"$SWEEP" run --quiet -j 2 --study "$KILLED" --out "$WORK/killed-local" >/dev/null || fail "local run (killed study)"
"$SWEEP" merge --study "$KILLED" --out "$WORK/killed-local" >/dev/null || fail "local merge (killed study)"
mv "$WORK/trace.csv" "$WORK/trace.real"
mkfifo "$WORK/trace.csv" || fail "mkfifo"
out=$("$SWEEP" slurm --study "$KILLED" --out "$WORK/killed") || fail "submit (killed study): $out"
job3=$(echo "$out" | tail -1)
cat "$WORK/trace.real" > "$WORK/trace.csv"  # blocks until the first cell opens the pipe
slurm_wait_for "\"$SWEEP\" status --study \"$KILLED\" --out \"$WORK/killed\" | head -1 | grep -q '^1 done'" 300 ||
  fail "the first cell did not finish: $("$SWEEP" status --study "$KILLED" --out "$WORK/killed")"
running=$(squeue -h -j "$job3" -t R)
[ -n "$running" ] || fail "task of job $job3 is not running: $(squeue -j "$job3" 2>&1)"
scancel "$job3" || fail "scancel $job3"
wait_job "$job3"
# The cancelled task's cell (waiting on the pipe) went with it: killed with its runner (run-cell --parent), so it
# is gone about when the job is; the wait is as long as the others' (only a hung cluster takes that long).
gone_from=$SECONDS
slurm_wait_for "! pgrep -f 'run-cell --study $KILLED'" 300 ||
  fail "a cell of the cancelled task still runs: $(ps -o pid,ppid,stat,etime,args -p "$(pgrep -d, -f "run-cell --study $KILLED")")"
echo "the cancelled task's cell was gone $((SECONDS - gone_from)) s after its job left the queue"
status=$("$SWEEP" status --study "$KILLED" --out "$WORK/killed")
echo "after the killed task: $status"
[[ "$(echo "$status" | head -1)" =~ ^1\ done,\ [0-9]+\ failed,\ [0-9]+\ remaining$ ]] || fail "status after kill: $status"
rm "$WORK/trace.csv"
mv "$WORK/trace.real" "$WORK/trace.csv"
out=$("$SWEEP" slurm --study "$KILLED" --out "$WORK/killed") || fail "resubmit (killed study): $out"
job4=$(echo "$out" | tail -1)
wait_job "$job4"
status=$("$SWEEP" status --study "$KILLED" --out "$WORK/killed")
[ "$(echo "$status" | head -1)" = "4 done, 0 failed, 0 remaining" ] || fail "status after retrying the killed task: $status"
grep -q "3 ran, 1 already done" "$WORK/killed/slurm/task-${job4}_0.out" ||
  fail "the retried task did not skip the finished cell: $(cat "$WORK/killed/slurm/task-${job4}_0.out")"
"$SWEEP" merge --study "$KILLED" --out "$WORK/killed" >/dev/null || fail "merge (killed study)"
for f in study.json cells.csv groups.csv; do
  cmp "$WORK/killed-local/merged/$f" "$WORK/killed/merged/$f" || fail "merged $f differs after the killed task"
done
echo "slurm sweep: jobs $job and $job2, merges equal; job $job3 killed mid-run, retried as $job4, merge equal"

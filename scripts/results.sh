#!/usr/bin/env bash
# Reproduces docs/results.md: every scheduling policy replayed on the real Philly trace (82,247 jobs) on 440
# devices with the trace's own arrival times (offered load 0.85), first with no run-time estimates at all
# (the scheduler knows only what it learns from finished jobs), then with exact estimates for reference; then
# on Alibaba's GPU trace of 2023 (6,178 jobs, 26 devices, own arrival times) and a synthetic FPGA workload, then
# FPGA sharing (the hold and reuse rules, slots: scripts/fpga_sharing.sh).
# Writes the tables to docs/results.md, JSON and SVG plots to docs/results/.
# Usage: scripts/results.sh            (builds into build/ first; set BUILD=dir to use another build folder)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
start=$(date +%s)

cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" --target accelpool-sim
SIM="$BUILD/bin/accelpool-sim"

TRACE=scheduler/sim/traces/philly.csv
COMMON=(--trace "$TRACE" --format philly --devices 440 --seed 1 --deterministic --quiet)
POLICIES=fifo,sjf,srpt,las,djsf,fair,gittins,fifo+age,gittins+age,fifo+guard=86400,gittins+guard=86400
ORACLE=sjf,srpt,djsf
# A synthetic FPGA workload: heavy-tailed run times, gangs, 8 Zipf-popular bitstreams, 30 s to reprogram.
FPGA=(--synthetic 20000 --runtime-dist lognormal --mean-runtime 600 --sigma 2 --gangs 1:0.8,2:0.15,4:0.05
      --bitstreams 8 --tenants 4 --reconfig-s 30 --devices 64 --load 0.9 --seed 1 --deterministic --quiet)
FPGA_POLICIES=fifo,sjf,srpt,las,djsf,fair,gittins,gittins+affinity,fifo+age,gittins+age,fifo+guard=86400
# Alibaba's GPU cluster, 2023 (see scheduler/sim/traces/README.md): its own arrival times on 26 devices.
ALIBABA=(--trace scheduler/sim/traces/alibaba-gpu-2023.csv --devices 26 --seed 1 --deterministic --quiet)

mkdir -p docs/results docs/results/oracle docs/results/fpga docs/results/alibaba
"$SIM" "${COMMON[@]}" --policy "$POLICIES" --estimates none \
  --json docs/results/philly.json --plot docs/results > docs/results/philly.txt
"$SIM" "${COMMON[@]}" --policy "$ORACLE" --estimates oracle \
  --json docs/results/philly-oracle.json --plot docs/results/oracle > docs/results/philly-oracle.txt
# How gittins depends on the estimator's settings (warm-up x decay half-life), same trace and pool.
: > docs/results/sensitivity.txt
for warmup in 1 3 5; do
  for half_life in 100 300 3000 1000000000; do
    "$SIM" "${COMMON[@]}" --policy gittins --estimates none --learn-warmup "$warmup" --learn-half-life "$half_life" |
      awk -v w="$warmup" -v h="$half_life" '$1 ~ /^gittins/ { printf "| %s | %s | %s | %s | %s |\n", w, h, $2, $3, $5 }' \
      >> docs/results/sensitivity.txt
  done
done
"$SIM" "${FPGA[@]}" --policy "$FPGA_POLICIES" --estimates none \
  --json docs/results/fpga.json --plot docs/results/fpga > docs/results/fpga.txt
"$SIM" "${ALIBABA[@]}" --policy "$POLICIES" --estimates none \
  --json docs/results/alibaba.json --plot docs/results/alibaba > docs/results/alibaba.txt

# The summary table: each row against the first (fifo) and the lower bound, from the simulator's text table.
summary() {
  awk -v reads="$1" '
    BEGIN { n = split(reads, r, ";"); for (i = 1; i <= n; i++) { split(r[i], kv, "="); what[kv[1]] = kv[2] } }
    /^policy/ { table = 1; next }
    table && NF > 5 {
      name = $1; avg = $2; bound = $3; p99 = $5
      if (!fifo_avg) { fifo_avg = avg; fifo_p99 = p99 }
      base = name; sub(/\+.*/, "", base)
      if (name ~ /guard=/) base = base "+guard"
      if (name ~ /age=/) base = base "+age"
      printf "| %s | %s | %.2fx | %.2fx | %.2f |\n", name, what[base], fifo_avg / avg, fifo_p99 / p99, bound
    }'
}
# The summary table of one run, then the simulator's own table.
tables() {
  echo "| policy | reads | avg JCT better than fifo | p99 JCT better than fifo | avg / lower bound |"
  echo "|---|---|---|---|---|"
  summary "$READS" < "$1"
  printf '\n```text\n'
  cat "$1"
  echo '```'
}
READS="fifo=arrival time;sjf=learned estimate;srpt=learned estimate, service received;las=service received;djsf=learned estimate x gang size;fair=tenant usage;gittins=service received, learned distribution;fifo+guard=arrival time, learned estimate (reservations);gittins+guard=service received, learned distribution, learned estimate (reservations);fifo+age=arrival time, learned estimate;gittins+age=service received, learned distribution, learned estimate"

{
  cat <<'HEAD'
# Results: policies on two real traces and a synthetic FPGA workload

Produced by `scripts/results.sh` (do not edit by hand). Every policy replays the same 82,247 jobs of
Microsoft's Philly GPU cluster (`scheduler/sim/traces/philly.csv`, see its README) on 440 network-attached
devices with the trace's own arrival times (offered load 0.85). Run times and gang sizes are the trace's; there
is one bitstream and no reprogramming or attach cost, so placement matters only for gangs. `/bound` is the
average JCT over the clairvoyant lower bound (see `docs/simulator.md`); JCTs are in seconds; `wall s` is this
machine's time for the run. Completions at one instant are reported to the scheduler one at a time (the
simulator's default rule, see `docs/simulator.md`).

## No estimates: only what the pool learns

`--estimates none`: no request says how long it runs, and no policy reads the true run time. sjf, srpt, djsf
and the guard's reservations go by the run times the scheduler learned from jobs that finished before
(grouped by tenant and gang size here: the trace has no bitstreams or labels); gittins by the learned
distribution (see docs/policies.md). "better" is fifo's value over the policy's (higher is better).

HEAD
  tables docs/results/philly.txt
  cat <<'MID'

![JCT CDF](results/jct_cdf.svg)

![Waiting requests over time](results/queue.svg)

What the table says. Without any estimate, `gittins` is the best policy: 8.8x fifo's average JCT and 4.9x
its p99, at 2.00 times the lower bound (1.9992) with the estimator's defaults. Across the estimator's settings
(table below) it ranges from 1.99 to 2.07, so read "about twice the bound" rather than a margin (the
clairvoyant srpt below reaches 1.76). It needs no estimate: it learns each group's
distribution of service and serves first the requests most likely to finish soon per device-second, so short
jobs finish early as under las, but a job that outlived its group's short mode sinks only as far as its
group's distribution says, which keeps long jobs from starving behind one another (las' p99 is hardly better
than fifo's). sjf, srpt and djsf on learned estimates gain less than with exact ones (groups here are only
tenant x gang size, so one estimate speaks for very different jobs); srpt suffers most, because a job that
outlives its group's mean counts as almost done and is never preempted. Slowdown aging (`+age`, default
slowdown 100) betters fifo on the average (1.14x) and the p99 (1.03x) and leaves gittins as it is: under
gittins no request waits a hundred times its run time (its p99 slowdown is 1.7). The tail guard (one day)
leaves fifo as it is: nearly every request it would reserve for waits behind leases that all outlived their
learned estimates, and then it reserves nothing (docs/policies.md; before that rule its idle reservations made
fifo's average 3.3x worse). Under gittins the guard costs 9x the average: requests that waited a day get leases
that are never preempted, which undoes what gittins gains by preempting.

How much gittins depends on the estimator's settings (`--learn-warmup`, `--learn-half-life`; the table
above uses the defaults, 3 and 100; 1000000000 means no decay):

| warm-up | half-life | avg JCT s | avg / lower bound | p99 JCT s |
|---|---|---|---|---|
MID
  cat docs/results/sensitivity.txt
  cat <<'MID'

## Exact estimates (oracle), for reference

`--estimates oracle`: every request brings its exact run time as its estimate, what perfect estimates would buy.

```text
MID
  cat docs/results/philly-oracle.txt
  cat <<'MID'
```

## A second real trace: Alibaba's GPU cluster, 2023

6,178 GPU jobs submitted over 34 days to a production GPU cluster of Alibaba (`cluster-trace-gpu-v2023`,
converted by `scheduler/sim/traces/convert_alibaba_gpu_2023.py`; source, terms and rules in
`scheduler/sim/traces/README.md`) on 26 devices with the trace's own arrival times (offered load 0.84),
`--estimates none`. Run times are heavy-tailed (median 638 s, mean 8,252 s); 99% of jobs take one GPU. Jobs
carry a label (the pod's resource request, shared by pods of one template), so learned groups here are tenant
(QoS class) x gang size x label.

MID
  tables docs/results/alibaba.txt
  cat <<'MID'

What the table says. `gittins` is again the best policy without estimates: 9.7x fifo's average JCT and 4.4x
its p99, at 1.09 times the lower bound; las, which reads only the service received, is close (1.13). Here the
labels let the estimator tell job templates apart, yet sjf and srpt on learned estimates, non-preemptive or
trusting the mean, still make the p99 worse than fifo's: a long job of a group whose mean is short waits behind
every shorter estimate. djsf, which counts gang size, does better on both. Slowdown aging with its default
(100) changes fifo by 0.2% (better on both) and gittins not at all; the one-day guard leaves fifo as it is and
makes gittins' average 3x and p99 8x worse (protected leases again).

## A synthetic FPGA workload

20,000 jobs from `accelpool-sim --synthetic` (Poisson arrivals, lognormal run times with mean 600 s and sigma
2, gangs of 1/2/4 devices at 80/15/5%, 8 bitstreams with Zipf popularity, 4 tenants) on 64 FPGAs that take
30 s to reprogram, offered load 0.9, `--estimates none`. Learned groups here are tenant x bitstream x gang size.

MID
  tables docs/results/fpga.txt
  cat <<'TAIL'

What the table says. This workload is light on contention for long: run times are drawn independently of
tenant and bitstream, so the learned groups cannot tell short jobs from long ones, and every policy is within
1.3x of the lower bound. gittins with `affinity` placement is best on the average (fewer reprogrammings than
first-fit); no policy improves fifo's p99 here, which is set by the longest jobs. With its default (slowdown
100) slowdown aging never acts here: fifo+age and gittins+age equal fifo and gittins.

Raw numbers: `docs/results/philly.json`, `docs/results/philly-oracle.json`, `docs/results/alibaba.json`,
`docs/results/fpga.json`.

## A study with confidence intervals: 1,000 runs

Made by `accelpool-sweep` ([sweeps.md](sweeps.md); cost in [benchmarks.md](benchmarks.md#sweeps-a-1000-run-study)),
not by this script: 5 policies x 10 offered loads x 20 seeds on one week of the Philly trace (11,967 jobs), 374
devices, run times announced with lognormal noise (`noisy:1`, a new draw per seed). Lines are means over the 20
seeds, bands the 95% confidence intervals (Student t). Only sjf and srpt read the announced run times, so only
they vary with the seed; fifo, las and gittins give the same run for every seed (interval 0).

![average JCT vs load](results/sweep/avg_jct.svg)
![p99 JCT vs load](results/sweep/p99_jct.svg)
![JCT CDF at load 0.9](results/sweep/jct_cdf.svg)

At load 0.95 the average JCT is fifo 18,535 s, sjf 14,956 ± 77 s, srpt 9,024 ± 24 s, las 8,819 s and gittins
8,797 s; gittins has the lowest p99 at every load from 0.7 up (135,383 s at 0.95, sjf 153,241 ± 925 s). With
estimates off by a factor of e at one sigma, sjf's average is 19% below fifo's at 0.95 but 66% above srpt's,
and srpt stays within 3% of las at every load. Every group's mean and interval: `docs/results/sweep/groups.csv`.
TAIL
  echo
  scripts/fpga_sharing.sh "$SIM"
} > docs/results.md
rm docs/results/philly.txt docs/results/philly-oracle.txt docs/results/fpga.txt docs/results/alibaba.txt \
  docs/results/sensitivity.txt

echo "docs/results.md written in $(( $(date +%s) - start )) s"

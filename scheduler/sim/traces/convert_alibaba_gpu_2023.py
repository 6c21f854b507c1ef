#!/usr/bin/env python3
"""Converts Alibaba's cluster-trace-gpu-v2023 pod list to accelpool-sim's native CSV.

Input: `cluster-trace-gpu-v2023/csv/openb_pod_list_default.csv` of https://github.com/alibaba/clusterdata
(columns name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,
scheduled_time; times in seconds from the trace start). Output columns: arrival_s,runtime_s,devices,tenant,label.

Rules (each pod is one job):
- pods that ask for no GPU (num_gpu 0) or were never scheduled (empty scheduled_time) are left out;
- the record covers pods created from day 115 (WINDOW_START_S) to its end; the few pods created before (one
  every few days over 114 days) were already running when it starts and are left out too;
- arrival_s = creation_time - WINDOW_START_S; runtime_s = deletion_time - scheduled_time (the time it held its
  GPUs; pods still running at the end of the record count until then);
- devices = num_gpu (a pod that shares one GPU, gpu_milli < 1000, asks for a whole device: the pool does not
  share devices);
- tenant = qos (LS, BE, Burstable, Guaranteed: the trace names no users);
- label = "<cpu_milli>c<memory_mib>m<gpu_milli>g", the pod's resource request, which pods made from the same
  job template share (what a guest would give as its label).
Rows come out sorted by arrival (ties by pod name). Stdlib only.

Usage: convert_alibaba_gpu_2023.py openb_pod_list_default.csv > alibaba-gpu-2023.csv
"""
import csv
import sys

WINDOW_START_S = 115 * 86400


def convert(rows):
    jobs = []
    for r in rows:
        gpus = int(r["num_gpu"])
        arrival = int(r["creation_time"]) - WINDOW_START_S
        if gpus == 0 or r["scheduled_time"] == "" or arrival < 0:
            continue
        runtime = int(r["deletion_time"]) - int(r["scheduled_time"])
        if runtime < 0:
            raise ValueError(f"{r['name']}: deleted before it was scheduled")
        label = f"{r['cpu_milli']}c{r['memory_mib']}m{r['gpu_milli']}g"
        jobs.append((arrival, r["name"], runtime, gpus, r["qos"], label))
    jobs.sort()
    return jobs


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    with open(sys.argv[1], newline="") as f:
        jobs = convert(csv.DictReader(f))
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(["arrival_s", "runtime_s", "devices", "tenant", "label"])
    for arrival, _name, runtime, gpus, qos, label in jobs:
        out.writerow([arrival, runtime, gpus, qos, label])


if __name__ == "__main__":
    main()

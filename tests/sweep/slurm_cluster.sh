# Sourced by the Slurm tests: starts a private single-node Slurm (munged, slurmctld, slurmd) on localhost in
# a temporary folder, as the current user. After `slurm_start DIR`, SLURM_CONF points at its slurm.conf, so
# sbatch/squeue/scancel talk to it; `slurm_stop` ends the daemons it started (by their pid files).
# slurm_start returns 77 (the tests' skip code) with the reason on stderr when Slurm cannot start here.

slurm_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Waits up to $2 seconds for the command $1 to succeed, polling every 0.2 s.
slurm_wait_for() {
  local deadline=$((SECONDS + $2))
  until eval "$1" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.2
  done
}

slurm_start() {
  SLURM_DIR=$1
  local missing=""
  for bin in munged slurmctld slurmd sbatch squeue scancel scontrol; do
    command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || missing="$missing $bin"
  done
  if [ -n "$missing" ]; then
    echo "SKIP: Slurm is not installed (missing:$missing; scripts/setup.sh installs slurm-wlm and munge)" >&2
    return 77
  fi
  export PATH="$PATH:/usr/sbin"
  mkdir -p "$SLURM_DIR/munge" "$SLURM_DIR/state" "$SLURM_DIR/spool" "$SLURM_DIR/log"
  chmod 700 "$SLURM_DIR/munge"
  head -c 1024 /dev/urandom > "$SLURM_DIR/munge/munge.key"
  chmod 400 "$SLURM_DIR/munge/munge.key"
  if ! munged --force --key-file="$SLURM_DIR/munge/munge.key" --socket="$SLURM_DIR/munge/munge.sock" \
      --pid-file="$SLURM_DIR/munge/munged.pid" --log-file="$SLURM_DIR/log/munged.log" \
      --seed-file="$SLURM_DIR/munge/munge.seed" 2>"$SLURM_DIR/log/munged.err"; then
    echo "SKIP: munged does not start here: $(cat "$SLURM_DIR/log/munged.err" "$SLURM_DIR/log/munged.log" 2>/dev/null | tail -3)" >&2
    return 77
  fi
  local user node cpus ctld_port d_port
  user=$(id -un)
  node=$(hostname -s)
  cpus=$(nproc)
  ctld_port=$(slurm_free_port)
  d_port=$(slurm_free_port)
  cat > "$SLURM_DIR/slurm.conf" <<CONF
ClusterName=accelpooltest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SLURM_DIR/munge/munge.sock
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool/slurmd-%n
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd.pid
SlurmctldLogFile=$SLURM_DIR/log/slurmctld.log
SlurmdLogFile=$SLURM_DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=3600
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
  export SLURM_CONF="$SLURM_DIR/slurm.conf"
  if ! slurmctld -i 2>"$SLURM_DIR/log/slurmctld.err"; then
    echo "SKIP: slurmctld does not start here: $(tail -3 "$SLURM_DIR/log/slurmctld.err" "$SLURM_DIR/log/slurmctld.log" 2>/dev/null)" >&2
    slurm_stop
    return 77
  fi
  if ! slurmd -N "$node" 2>"$SLURM_DIR/log/slurmd.err"; then
    echo "SKIP: slurmd does not start here: $(tail -3 "$SLURM_DIR/log/slurmd.err" "$SLURM_DIR/log/slurmd.log" 2>/dev/null)" >&2
    slurm_stop
    return 77
  fi
  # The node is usable once the controller sees it idle.
  if ! slurm_wait_for "sinfo -h -n $node -o %t | grep -qx idle" 60; then
    echo "SKIP: the Slurm node never became idle: $(sinfo -h -N 2>&1 | head -2); $(tail -3 "$SLURM_DIR/log/slurmd.log" "$SLURM_DIR/log/slurmctld.log" 2>/dev/null)" >&2
    slurm_stop
    return 77
  fi
  return 0
}

slurm_stop() {
  local f pid
  for f in "$SLURM_DIR/slurmd.pid" "$SLURM_DIR/slurmctld.pid" "$SLURM_DIR/munge/munged.pid"; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    [ -n "$pid" ] && kill "$pid" 2>/dev/null
    slurm_wait_for "! kill -0 $pid" 30 || kill -9 "$pid" 2>/dev/null
  done
}

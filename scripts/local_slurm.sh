#!/usr/bin/env bash
# A single-node Slurm on this machine, as on a workstation, for trying `opforge slurm --submit`
# and for its test (tests/test_launchers.cpp). Everything lives in DIR: a generated munge key and
# munged on its own socket, a generated slurm.conf (node localhost with 2 CPUs, no cgroups,
# no accounting), state, spool, logs and pid files; free ports are picked so it does not clash
# with a site Slurm or another copy. Run as root (slurmd starts jobs as their user).
#   scripts/local_slurm.sh start DIR   # prints `export SLURM_CONF=DIR/slurm.conf` on stdout
#   scripts/local_slurm.sh stop DIR    # scontrol shutdown, then munged; waits until all are gone
# Needs Debian's slurm-wlm and munge (`make setup` installs them).
set -euo pipefail
log() { printf '[local_slurm] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

usage() { die "usage: $0 start|stop DIR"; }
[ $# -eq 2 ] || usage
cmd=$1
dir=$(mkdir -p "$2" && cd "$2" && pwd)
conf=$dir/slurm.conf

# A port nothing listens on, from a range unlikely to be used, different per call.
free_port() {
  local p
  for _ in $(seq 200); do
    p=$((20000 + RANDOM % 20000))
    (exec 3<> "/dev/tcp/127.0.0.1/$p") 2> /dev/null || { echo "$p"; return; }
  done
  die "no free port found in 20000-39999"
}

start_munge() {
  mkdir -p "$dir/munge"
  chmod 700 "$dir/munge"
  # munged checks that its key is private to it.
  [ -f "$dir/munge/munge.key" ] || { dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none; }
  chmod 400 "$dir/munge/munge.key"
  # --force: munged refuses root and a socket outside /run/munge without it.
  munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --log-file="$dir/munge/munged.log" --pid-file="$dir/munge/munged.pid" --seed-file="$dir/munge/munged.seed" \
    || die "munged did not start; its log: $(tail -5 "$dir/munge/munged.log" 2> /dev/null)"
}

write_conf() {
  mkdir -p "$dir/state" "$dir/spool" "$dir/log"
  cat > "$conf" << EOF
ClusterName=opforge-local
SlurmctldHost=localhost
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
MinJobAge=300
NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=local Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
}

start() {
  [ "$(id -u)" -eq 0 ] || die "run as root: slurmd starts each job as its submitting user"
  for b in munged slurmctld slurmd sinfo; do
    command -v "$b" > /dev/null || die "$b not found: install Debian's slurm-wlm and munge (make setup)"
  done
  start_munge
  write_conf
  export SLURM_CONF=$conf
  # -i: ignore state left by an earlier run of this DIR.
  slurmctld -i -f "$conf" || die "slurmctld did not start: $(tail -5 "$dir/log/slurmctld.log")"
  slurmd -f "$conf" -N localhost || die "slurmd did not start: $(tail -5 "$dir/log/slurmd.log")"
  for _ in $(seq 120); do
    state=$(sinfo -h -n localhost -o %T 2> /dev/null || true)
    [ "$state" = idle ] && { echo "export SLURM_CONF=$conf"; return; }
    sleep 0.5
  done
  log "the node did not become idle (state '${state:-}'); logs in $dir/log"
  tail -5 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 || true
  exit 1
}

# Waits up to 30 s for the process named in pid file $1 to end; then SIGKILLs it.
wait_pidfile() {
  [ -f "$1" ] || return 0
  local pid
  pid=$(cat "$1")
  for _ in $(seq 60); do kill -0 "$pid" 2> /dev/null || return 0; sleep 0.5; done
  log "process $pid ($1) still runs after 30 s; killing it"
  kill -9 "$pid" 2> /dev/null || true
}

stop() {
  if [ -f "$conf" ]; then
    SLURM_CONF=$conf scontrol shutdown 2> /dev/null || {
      # The controller is gone or never came up: end the daemons by their pid files.
      for f in "$dir/slurmd.pid" "$dir/slurmctld.pid"; do [ -f "$f" ] && kill "$(cat "$f")" 2> /dev/null || true; done
    }
    wait_pidfile "$dir/slurmctld.pid"
    wait_pidfile "$dir/slurmd.pid"
  fi
  if [ -f "$dir/munge/munged.pid" ]; then
    munged --stop --socket="$dir/munge/munge.socket" 2> /dev/null || kill "$(cat "$dir/munge/munged.pid")" 2> /dev/null || true
    wait_pidfile "$dir/munge/munged.pid"
  fi
}

case $cmd in
  start) start ;;
  stop) stop ;;
  *) usage ;;
esac

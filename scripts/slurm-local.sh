#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for hcp-tune's slurm tests and for trying
# sweeps without a real cluster.
#
#   scripts/slurm-local.sh start    install slurm-wlm + munge if missing, write the config,
#                                   start munged, slurmctld, slurmd; wait until the node is idle
#   scripts/slurm-local.sh stop     stop the daemons this script started
#                                   (an interrupted `start` stops those it had started)
#   scripts/slurm-local.sh status   say what runs and what sinfo reports
#
# The node advertises more than the machine has (16 CPUs, 8 GPUs backed by plain files)
# so multi-GPU job shapes can be submitted on a CPU-only box; `SlurmdParameters=
# config_overrides` makes slurmd accept that. No cgroups (containers), no slurmdbd, so
# `sacct` is unavailable: submitit then warns and hcp-tune asks squeue instead.
# Needs root. Idempotent: `start` on a running cluster only checks it.
set -euo pipefail

STATE_DIR="${HCP_TUNE_SLURM_STATE:-/var/lib/hcp-tune-slurm}"
CONF_DIR=/etc/slurm            # where Debian's slurm-wlm looks for slurm.conf
CONF="$CONF_DIR/slurm.conf"
HOST="$(hostname -s)"
NODE_CPUS=16                   # more than real: trial jobs ask for CPUs per GPU
NODE_MEM_MB=16000              # advertised only; memory is not a scheduled resource here
NODE_GPUS=8
WAIT_S="${HCP_TUNE_SLURM_WAIT_S:-60}"

log() { echo "slurm-local: $*"; }
die() { echo "slurm-local: error: $*" >&2; exit 1; }

need_root() { [[ $(id -u) -eq 0 ]] || die "must run as root (it installs packages and starts daemons)"; }

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
        && command -v sbatch >/dev/null && command -v munged >/dev/null; then
        return
    fi
    log "installing slurm-wlm and munge from Debian packages (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null
    command -v slurmctld >/dev/null || die "slurm-wlm installed but slurmctld is not on PATH"
}

write_config() {
    mkdir -p "$CONF_DIR" "$STATE_DIR"/{ctld,spool,log,run,dev}
    local i
    for ((i = 0; i < NODE_GPUS; i++)); do
        : >"$STATE_DIR/dev/gpu$i"   # stand-in device files: gres/gpu needs one file per GPU
    done
    cat >"$CONF" <<EOF
# Written by hcp-tune scripts/slurm-local.sh: a one-node test cluster. Do not edit.
ClusterName=local
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE_DIR/ctld
SlurmdSpoolDir=$STATE_DIR/spool
SlurmctldPidFile=$STATE_DIR/run/slurmctld.pid
SlurmdPidFile=$STATE_DIR/run/slurmd.pid
SlurmctldLogFile=$STATE_DIR/log/slurmctld.log
SlurmdLogFile=$STATE_DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
KillWait=5
MinJobAge=600
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=$HOST CPUs=$NODE_CPUS RealMemory=$NODE_MEM_MB Gres=gpu:$NODE_GPUS State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
    cat >"$CONF_DIR/gres.conf" <<EOF
# Written by hcp-tune scripts/slurm-local.sh: stand-in GPUs, plain files.
NodeName=$HOST Name=gpu File=$STATE_DIR/dev/gpu[0-$((NODE_GPUS - 1))]
EOF
    log "wrote $CONF and $CONF_DIR/gres.conf (node $HOST: $NODE_CPUS CPUs, gpu:$NODE_GPUS)"
}

pid_alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

STARTED=()  # the daemons this `start` began, stopped again if it is interrupted
interrupted() {
    trap - INT TERM
    log "interrupted: stopping the daemons this start began (${STARTED[*]:-none})"
    local i
    for ((i = ${#STARTED[@]} - 1; i >= 0; i--)); do
        stop_pidfile "${STARTED[i]}" "$STATE_DIR/run/${STARTED[i]}.pid"
    done
    exit 130
}

start_munge() {
    if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
        log "munged already answers"
        return
    fi
    if [[ ! -s /etc/munge/munge.key ]]; then
        log "creating munge key"
        mkdir -p /etc/munge
        if command -v mungekey >/dev/null; then mungekey --create --keyfile=/etc/munge/munge.key --force
        else dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; fi
    fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /etc/munge/munge.key /run/munge /var/log/munge /var/lib/munge
    chmod 0400 /etc/munge/munge.key
    chmod 0755 /run/munge
    log "starting munged"
    runuser -u munge -- munged
    cp /run/munge/munged.pid "$STATE_DIR/run/munged.pid" 2>/dev/null || true
    STARTED+=(munged)
    local i
    for ((i = 0; i < 20; i++)); do
        munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && return
        sleep 0.5
    done
    die "munged did not come up (see /var/log/munge/munged.log)"
}

dump_logs() {
    local f
    for f in "$STATE_DIR/log/slurmctld.log" "$STATE_DIR/log/slurmd.log"; do
        [[ -f "$f" ]] && { echo "--- tail of $f" >&2; tail -n 25 "$f" >&2; }
    done
    return 0
}

node_state() { sinfo -h -o %t 2>/dev/null | head -n1; }

start() {
    need_root
    install_packages
    mkdir -p "$STATE_DIR/run"
    if pid_alive "$STATE_DIR/run/slurmctld.pid" && pid_alive "$STATE_DIR/run/slurmd.pid" \
        && [[ "$(node_state)" == idle || "$(node_state)" == mix || "$(node_state)" == alloc ]]; then
        log "already running; node $HOST is $(node_state)"
        return
    fi
    trap interrupted INT TERM
    write_config
    start_munge
    if ! pid_alive "$STATE_DIR/run/slurmctld.pid"; then
        log "starting slurmctld"
        slurmctld || { dump_logs; die "slurmctld failed to start"; }
        STARTED+=(slurmctld)
    fi
    if ! pid_alive "$STATE_DIR/run/slurmd.pid"; then
        log "starting slurmd"
        slurmd || { dump_logs; die "slurmd failed to start"; }
        STARTED+=(slurmd)
    fi
    log "waiting up to ${WAIT_S}s for node $HOST to become idle"
    local deadline=$((SECONDS + WAIT_S)) state=""
    while ((SECONDS < deadline)); do
        state="$(node_state)"
        case "$state" in
            idle | mix | alloc) log "node $HOST is $state; cluster up (sbatch/squeue/scancel/sinfo ready)"; return ;;
            down* | drain* | inval*) scontrol update nodename="$HOST" state=resume 2>/dev/null || true ;;
        esac
        sleep 1
    done
    dump_logs
    die "node $HOST did not become idle within ${WAIT_S}s (last state: '${state:-no answer from slurmctld}')"
}

stop_pidfile() {
    local name=$1 file=$2
    if pid_alive "$file"; then
        local pid; pid="$(cat "$file")"
        log "stopping $name (pid $pid)"
        kill "$pid"
        local i
        for ((i = 0; i < 20; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    fi
    rm -f "$file"
}

stop() {
    need_root
    stop_pidfile slurmd "$STATE_DIR/run/slurmd.pid"
    stop_pidfile slurmctld "$STATE_DIR/run/slurmctld.pid"
    stop_pidfile munged "$STATE_DIR/run/munged.pid"   # only a munged this script started
    log "stopped"
}

status() {
    local rc=0 name
    for name in munged slurmctld slurmd; do
        if pid_alive "$STATE_DIR/run/$name.pid"; then log "$name running (pid $(cat "$STATE_DIR/run/$name.pid"))"
        else log "$name not started by this script"; fi
    done
    if command -v sinfo >/dev/null && sinfo -h >/dev/null 2>&1; then
        sinfo -o "%P %a %l %D %t %N %G"
        [[ "$(node_state)" =~ ^(idle|mix|alloc)$ ]] || rc=1
    else
        log "sinfo does not answer: cluster is down"
        rc=1
    fi
    return $rc
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac

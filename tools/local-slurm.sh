#!/usr/bin/env bash
# parsl-bft's copy of the local Slurm recipe (from ../shared/tools): "try it against a real Slurm in 10 seconds".
# local-slurm.sh - a real, single-host, multi-node Slurm cluster for CI (Debian 12 / bookworm, Slurm 22.05.8).
#
#   ./local-slurm.sh start     install (if needed) + write config + start munged, slurmctld, N slurmd; wait for nodes
#                        (daemons running with other settings - another AUTH, NODES, SWITCHES ... - are restarted)
#   ./local-slurm.sh stop      stop the daemons this script started (by PID from pid files); running jobs'
#                        slurmstepd survive and are re-adopted by 'start'/'restart'
#   ./local-slurm.sh status    show daemons + sinfo
#   ./local-slurm.sh clean     scancel all jobs, stop, remove all state/logs (config is rewritten on next start)
#   ./local-slurm.sh restart   stop + start (keeps job/node state unless SLURM_LOCAL_FRESH=1)
#
# Afterwards:  source $BASE/env.sh   (exports SLURM_CONF) and use sinfo/sbatch/squeue/... as usual.
#
# Knobs (environment):
#   SLURM_LOCAL_BASE   (default /tmp/local-slurm)  everything (config, state, logs, pids) lives here
#   SLURM_LOCAL_NODES  (default 8)     number of virtual nodes n1..nN (one slurmd each)
#   SLURM_LOCAL_CPUS   (default 4)     CPUs advertised per virtual node (may exceed real cores)
#   SLURM_LOCAL_MEM    (default 1000)  RealMemory (MB) advertised per virtual node
#   SLURM_LOCAL_PORT   (default 16817) slurmctld port; slurmd of node ni listens on PORT+1+i (16819..16826
#                      for 8 nodes); slurmdbd PORT+N+2, mariadbd PORT+N+3 (16827/16828 for 8 nodes)
#   SLURM_LOCAL_PART_OPTS (default "OverSubscribe=EXCLUSIVE")  extra options of partition "debug"
#                      (whole-node allocation, like most HPC sites); a 2nd partition "shared" is core-level;
#                      a 3rd, "backfill", is preemptable (PriorityTier 1 < 10, PreemptMode=CANCEL, GraceTime=10):
#                      parsl-bft's pilots go there, so a facility job never waits for one
#   SLURM_LOCAL_SWITCHES (default 2)  leaf switches of the tree topology (topology/tree, $ETC/topology.conf):
#                      nodes are split into that many contiguous blocks (8 nodes, 2: s0=n[1-4] s1=n[5-8];
#                      3: n[1-3] n[4-6] n[7-8]) under one spine; 'scontrol show topology' prints it.
#                      Written on every start; a running cluster picks it up only after a restart.
#   SLURM_LOCAL_FRESH=1  wipe job/node state on start (slurmctld -c semantics)
#   SLURM_LOCAL_AUTH   (default munge) munge | none  (none = auth/none + cred/none: no munged needed)
#   SLURM_LOCAL_DBD=1  also install+run MariaDB (private datadir under state/, TCP on 127.0.0.1) and
#                      slurmdbd, so plain 'sacct' works (needs munge auth). Records lag up to ~5 s
#                      (slurmctld sends job-start records from a periodic handler; until then sacct -j
#                      shows a placeholder 'allocation' row without partition). Default 0: no
#                      accounting DB; 'sacct' fails, 'sacct -c' reads the jobcomp/filetxt file.
set -euo pipefail

BASE=${SLURM_LOCAL_BASE:-/tmp/local-slurm}
NNODES=${SLURM_LOCAL_NODES:-8}
CPUS=${SLURM_LOCAL_CPUS:-4}
MEM=${SLURM_LOCAL_MEM:-1000}
PORT=${SLURM_LOCAL_PORT:-16817}
PART_OPTS=${SLURM_LOCAL_PART_OPTS:-OverSubscribe=EXCLUSIVE}
AUTH=${SLURM_LOCAL_AUTH:-munge}
DBD=${SLURM_LOCAL_DBD:-0}
SWITCHES=${SLURM_LOCAL_SWITCHES:-2}
DBD_PORT=$((PORT + NNODES + 2))   # slurmdbd
SQL_PORT=$((PORT + NNODES + 3))   # private mariadbd (only with SLURM_LOCAL_DBD=1)
ETC=$BASE/etc
STATE=$BASE/state
LOG=$STATE/log
CONF=$ETC/slurm.conf
HOST=$(hostname -s)
export SLURM_CONF=$CONF

log() { printf '[local-slurm.sh %s] %s\n' "$(date +%T)" "$*" >&2; }

pid_alive() {  # running and not a zombie (PID 1 here may reap daemonized children late)
  local st; st=$(ps -o stat= -p "$1" 2>/dev/null) || return 1; [ -n "$st" ] && [ "${st#Z}" = "$st" ]; }
alive() { [ -s "$1" ] && pid_alive "$(cat "$1")"; }

install_pkgs() {
  local need=0 pkgs="slurmctld slurmd slurm-client munge"
  [ "$DBD" = 1 ] && pkgs="$pkgs slurmdbd mariadb-server"
  for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need=1
  done
  if [ $need = 1 ]; then
    log "installing $pkgs from Debian"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # no systemd: postinst 'invoke-rc.d start' may be refused by policy-rc.d (fine) or fail; ignore that.
    apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
  fi
}

write_topology() {  # SWITCHES leaf switches over contiguous node blocks, one spine above them
  [ "$SWITCHES" -ge 1 ] && [ "$SWITCHES" -le "$NNODES" ] || { log "SLURM_LOCAL_SWITCHES=$SWITCHES: need 1..$NNODES"; return 1; }
  local per=$(( (NNODES + SWITCHES - 1) / SWITCHES )) lo=1 hi i=0
  : > "$ETC/topology.conf.tmp"
  while [ "$lo" -le "$NNODES" ]; do
    hi=$(( lo + per - 1 )); [ "$hi" -gt "$NNODES" ] && hi=$NNODES
    echo "SwitchName=s$i Nodes=n[$lo-$hi]" >> "$ETC/topology.conf.tmp"
    lo=$(( hi + 1 )); i=$(( i + 1 ))
  done
  echo "SwitchName=spine Switches=s[0-$(( i - 1 ))]" >> "$ETC/topology.conf.tmp"
  mv "$ETC/topology.conf.tmp" "$ETC/topology.conf"
}

write_conf() {
  mkdir -p "$ETC" "$STATE/ctld" "$LOG"
  local auth cred
  if [ "$AUTH" = none ]; then auth=auth/none; cred=cred/none; else auth=auth/munge; cred=cred/munge; fi
  local last=$((PORT + 1 + NNODES))
  local acct="AccountingStorageType=accounting_storage/none" gather=jobacct_gather/none
  if [ "$DBD" = 1 ]; then
    acct="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$HOST
AccountingStoragePort=$DBD_PORT"
    gather=jobacct_gather/linux
    # slurmdbd reads slurmdbd.conf from the directory of \$SLURM_CONF; must be 0600 and owned by SlurmUser
    ( umask 077; cat > "$ETC/slurmdbd.conf" <<EOF2
AuthType=auth/munge
DbdHost=$HOST
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
DebugLevel=info
LogFile=$LOG/slurmdbd.log
PidFile=$STATE/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$SQL_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF2
    )
  else
    rm -f "$ETC/slurmdbd.conf"
  fi
  write_topology
  cat > "$CONF.tmp" <<EOF
# Generated by local-slurm.sh - single-host multi-node Slurm 22.05 (Debian bookworm), no systemd, no cgroups.
ClusterName=localci
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
AuthType=$auth
CredType=$cred
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
DebugFlags=Backfill
MailProg=/bin/true
# --- plugins that need neither systemd nor cgroups
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=$gather
$acct
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG/jobcomp.txt
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
# advertise more CPUs/memory than the host has
SlurmdParameters=config_overrides
# --- scheduling: backfill, evaluated every second with 1 s resolution
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,bf_resolution=1,bf_continue,sched_interval=1,bf_window=1440
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
PriorityType=priority/basic
PreemptType=preempt/partition_prio
TopologyPlugin=topology/tree
PreemptMode=CANCEL
# --- short timers for CI
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
KillWait=5
OverTimeLimit=0
MessageTimeout=10
# --- N virtual nodes, one slurmd each (Debian's slurmd is built with MULTIPLE_SLURMD), all on this host
NodeName=n[1-$NNODES] NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$((PORT + 2))-$last CPUs=$CPUS Sockets=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$MEM State=UNKNOWN
PartitionName=debug  Nodes=n[1-$NNODES] Default=YES MaxTime=INFINITE State=UP PriorityTier=10 $PART_OPTS
PartitionName=shared Nodes=n[1-$NNODES] Default=NO  MaxTime=INFINITE State=UP PriorityTier=10
# preemptable: a waiting job of a higher tier takes these nodes back at once (SIGTERM, GraceTime, then kill)
PartitionName=backfill Nodes=n[1-$NNODES] Default=NO MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=CANCEL GraceTime=10 OverSubscribe=EXCLUSIVE
EOF
  mv "$CONF.tmp" "$CONF"
  cat > "$BASE/env.sh" <<EOF
export SLURM_CONF=$CONF
EOF
}

start_munge() {
  [ "$AUTH" = munge ] || return 0
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return 0; fi   # already running (ours or system)
  [ -s /etc/munge/munge.key ] || { log "creating munge key"; mungekey -c -f -k /etc/munge/munge.key; chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
  mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
  log "starting munged (as user munge)"
  runuser -u munge -- /usr/sbin/munged
  cp /run/munge/munged.pid "$STATE/munged.pid"     # marks 'started by local-slurm.sh'
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return 0; sleep 0.1; done
  log "munged did not come up"; return 1
}

start_dbd() {
  [ "$DBD" = 1 ] || return 0
  local sql="mariadb --socket=$STATE/mysql.sock -uroot"
  if ! alive "$STATE/mariadbd.pid"; then
    if [ ! -d "$STATE/mysql/mysql" ]; then
      log "initialising private MariaDB datadir"
      mariadb-install-db --user=root --datadir="$STATE/mysql" --auth-root-authentication-method=normal --skip-test-db >"$LOG/mariadb-install.log" 2>&1
    fi
    log "starting mariadbd on 127.0.0.1:$SQL_PORT"
    nohup mariadbd --user=root --datadir="$STATE/mysql" --socket="$STATE/mysql.sock" --port="$SQL_PORT" \
      --bind-address=127.0.0.1 --pid-file="$STATE/mariadbd.pid" --log-error="$LOG/mariadbd.err" \
      --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900 >/dev/null 2>&1 &
    for _ in $(seq 150); do $sql -e 'select 1' >/dev/null 2>&1 && break; sleep 0.2; done
    $sql -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
             GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"
  fi
  if ! alive "$STATE/slurmdbd.pid"; then
    log "starting slurmdbd on port $DBD_PORT"
    slurmdbd
    for _ in $(seq 100); do sacctmgr -n show cluster >/dev/null 2>&1 && break; sleep 0.2; done
  fi
  sacctmgr -n -P show cluster format=cluster | grep -qx localci || sacctmgr -i add cluster localci >/dev/null
}

start_slurm() {
  local fresh=()
  [ "${SLURM_LOCAL_FRESH:-0}" = 1 ] && fresh=(-c)
  if ! alive "$STATE/slurmctld.pid"; then
    log "starting slurmctld ${fresh[*]}"
    slurmctld -f "$CONF" "${fresh[@]}"
  fi
  for i in $(seq 1 "$NNODES"); do
    mkdir -p "$STATE/spool/n$i"
    if ! alive "$STATE/slurmd-n$i.pid"; then slurmd -f "$CONF" -N "n$i"; fi
  done
  log "waiting for $NNODES responding nodes"
  local t0=$SECONDS ready
  while :; do   # responding = idle/alloc/mix/comp without the '*' (not responding) suffix
    ready=$(sinfo -h -N -p debug -o '%t' 2>/dev/null | grep -c -x -E 'idle|alloc|mix|comp|plnd|resv' || true)
    [ "${ready:-0}" = "$NNODES" ] && break
    if [ $((SECONDS - t0)) -gt 60 ]; then log "nodes not ready after 60 s"; sinfo -N || true; return 1; fi
    sleep 0.5
  done
  log "cluster up: $(sinfo -h -p debug -o '%D %T %N' | paste -sd, -)"
}

stop_pids() {  # SIGTERM the given PIDs together, wait up to 15 s, then SIGKILL what is left
  local p left
  for p in "$@"; do pid_alive "$p" && kill "$p" 2>/dev/null || true; done
  for _ in $(seq 150); do
    left=0; for p in "$@"; do pid_alive "$p" && left=1; done
    [ $left = 0 ] && return 0; sleep 0.1
  done
  for p in "$@"; do pid_alive "$p" && kill -9 "$p" 2>/dev/null || true; done
}

stop_all() {
  local f pids=()
  for f in "$STATE"/slurmd-n*.pid; do [ -s "$f" ] && pids+=("$(cat "$f")"); done
  [ ${#pids[@]} -gt 0 ] && stop_pids "${pids[@]}"
  rm -f "$STATE"/slurmd-n*.pid
  [ -s "$STATE/slurmctld.pid" ] && stop_pids "$(cat "$STATE/slurmctld.pid")"
  rm -f "$STATE/slurmctld.pid"
  [ -s "$STATE/slurmdbd.pid" ] && stop_pids "$(cat "$STATE/slurmdbd.pid")"
  [ -s "$STATE/mariadbd.pid" ] && stop_pids "$(cat "$STATE/mariadbd.pid")"
  rm -f "$STATE/slurmdbd.pid" "$STATE/mariadbd.pid"
  # munged only if this script started it
  [ -s "$STATE/munged.pid" ] && stop_pids "$(cat "$STATE/munged.pid")"
  rm -f "$STATE/munged.pid"
  log "stopped"
}

cancel_all_jobs() {  # used by 'clean': no job processes (slurmstepd) may outlive the cluster
  alive "$STATE/slurmctld.pid" || return 0
  local ids; ids=$(squeue -h -o %i 2>/dev/null | tr '\n' ' ')
  [ -n "${ids// /}" ] || return 0
  log "cancelling jobs: $ids"; scancel $ids || true
  for _ in $(seq 60); do [ -z "$(squeue -h -t R,CG -o %i 2>/dev/null)" ] && return 0; sleep 0.5; done
}

status() {
  for f in "$STATE"/*.pid; do [ -e "$f" ] || continue; printf '%-22s pid %-7s %s\n' "$(basename "$f")" "$(cat "$f")" "$(alive "$f" && echo running || echo DEAD)"; done
  sinfo || true
}

start_or_restart() {  # a cluster left running with other settings (a test's AUTH, NODES, SWITCHES, PART_OPTS ...)
  local old=""        # would keep its daemons' old config while sinfo/sbatch read the new one: restart them
  [ -f "$CONF" ] && old=$(cat "$CONF" "$ETC/topology.conf" "$ETC/slurmdbd.conf" 2>/dev/null || true)
  write_conf
  if alive "$STATE/slurmctld.pid" && [ "$old" != "$(cat "$CONF" "$ETC/topology.conf" "$ETC/slurmdbd.conf" 2>/dev/null || true)" ]; then
    log "the running cluster has other settings: restarting its daemons with these (jobs kept unless SLURM_LOCAL_FRESH=1)"
    stop_all
  fi
  start_munge; start_dbd; start_slurm
}

case "${1:-start}" in
  start)   install_pkgs; start_or_restart ;;
  stop)    stop_all ;;
  restart) stop_all; install_pkgs; write_conf; start_munge; start_dbd; start_slurm ;;
  status)  status ;;
  clean)   cancel_all_jobs; stop_all; rm -rf "$STATE" "$BASE/env.sh" ;;
  *) echo "usage: $0 start|stop|restart|status|clean" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Runs deploy/slurm/cohort.sbatch on a real Slurm cluster made on this host, and checks that it
# completes a short federation (CTest: deploy_slurm, label root).
#
#   deploy/slurm/slurm_test.sh deploy/slurm/cohort.sbatch build/bin
#
# The cluster is Debian's slurm-wlm (packages slurmctld, slurmd, slurm-client, munge) with its own
# configuration, munge key and state in a temporary folder; nothing in /etc is read or changed.
# It starts one munged, one slurmctld and three slurmd (one per node name: Debian's Slurm is built
# with multiple-slurmd support), all as background processes of this script, then submits these
# jobs:
#   1. --nodes=1: 2 shards and 2 clients share the node (the one-node layout of the script);
#   2. --nodes=3: 2 shards on the first node, 2 clients on each of the other two (the default).
# Each runs a few federated rounds with the script's mutual TLS on Fashion-MNIST; the test checks
# the exit status, the job's output, the metrics file's rounds, the checkpoints and that the
# certificate folder is gone. A third job, on one node, is cancelled with scancel after two rounds:
# its certificate folder and processes must be gone. Every daemon and job is stopped on exit, also
# on failure, and every wait is bounded.
# Needs root (slurmd starts the job as the submitting user, and only root can do that for any
# user): as another user it exits 77, which CTest reports as skipped. Missing packages fail.
set -euo pipefail

sbatch_script="$(realpath "${1:?usage: slurm_test.sh COHORT_SBATCH BIN_DIR}")"
bin_dir="$(realpath "${2:?usage: slurm_test.sh COHORT_SBATCH BIN_DIR}")"
rounds=3
data_dir=/usr/share/datasets/fashion-mnist

log() { echo "slurm_test: $*" >&2; }
fail() {
  log "FAIL: $*"
  exit 1
}

if [ "$(id -u)" -ne 0 ]; then
  log "skipped: needs root (runs slurmctld, slurmd and munged)"
  exit 77
fi
for p in slurmctld slurmd munged sbatch sinfo squeue scancel scontrol; do
  command -v "$p" >/dev/null 2>&1 ||
    fail "$p not found: apt-get install -y slurmctld slurmd slurm-client munge"
done
for b in cohort-server cohort-client cohort-keygen; do
  [ -x "$bin_dir/$b" ] || fail "$bin_dir/$b not built"
done
[ -r "$data_dir/train-images-idx3-ubyte.gz" ] || fail "no Fashion-MNIST in $data_dir (dataset-fashion-mnist)"
host="$(hostname -s)"
# Shard 1 advertises its node name, and the coordinator is the first node's name: the first node
# is this host under its own name, which must resolve (the other two are aliases of 127.0.0.1).
getent ahostsv4 "$host" >/dev/null || fail "the host name $host does not resolve (getent ahostsv4)"

# Free TCP ports: slurmctld, three slurmd, and two consecutive ones for the shards.
read -r ctld_port d0_port d1_port d2_port cohort_port < <(
  /usr/bin/python3 - <<'EOF'
import socket
held, ports = [], []
def grab(port=0):
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", port))
    except OSError:
        s.close()
        return None
    held.append(s)
    return s.getsockname()[1]
while len(ports) < 4:
    ports.append(grab())
for _ in range(100):
    p = grab()
    if p < 65535 and grab(p + 1):
        ports.append(p)
        break
print(*ports)
EOF
)
[ -n "$cohort_port" ] || fail "found no two free consecutive TCP ports"

tmp="$(mktemp -d /tmp/cohort-slurm-test.XXXXXX)"
chmod 755 "$tmp"  # munged wants its socket's folders searchable by all
mkdir -m 700 "$tmp/munge-key" "$tmp/state"
mkdir -m 755 "$tmp/munge" "$tmp/spool" "$tmp/log" "$tmp/submit"
export SLURM_CONF="$tmp/slurm.conf"
marker="COHORT_SLURM_TEST_JOB=$tmp"  # in the jobs' environment only (sbatch --export)
unset SLURM_JOB_ID SLURM_JOBID SLURM_JOB_NODELIST SLURM_NODELIST

pids=()
# shellcheck disable=SC2317  # invoked by the trap
cleanup() {
  local rc=$? i
  trap - EXIT INT TERM
  if [ "${#pids[@]}" -gt 0 ]; then
    # Jobs first, while slurmd is there to stop their processes; then the daemons.
    timeout 10 scancel --full "--name=cohort-slurm-test" >/dev/null 2>&1 || true
    for ((i = 0; i < 20; i++)); do
      [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break
      sleep 1
    done
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for ((i = 0; i < 20; i++)); do
      alive=0
      for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
      [ "$alive" -eq 0 ] && break
      sleep 0.5
    done
    for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    stray_tasks
  fi
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then
    for f in "$tmp"/log/*.log "$tmp"/submit/*.out; do
      [ -f "$f" ] || continue
      log "--- last lines of $f"
      tail -n 40 "$f" >&2
    done
  fi
  rm -rf "$tmp"
  exit "$rc"
}
# The processes of this test's jobs: they carry the test's marker variable in their environment.
job_pids() {
  local p
  for p in /proc/[0-9]*; do
    if tr '\0' '\n' 2>/dev/null <"$p/environ" | grep -cxF "$marker" >/dev/null; then
      echo "${p#/proc/}"
    fi
  done
}
# Job processes that outlived their slurmd (only after a failure).
# shellcheck disable=SC2317
stray_tasks() {
  local p
  for p in $(job_pids); do
    log "stopping a leftover job process $p: $(tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline")"
    kill -KILL "$p" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'exit 143' INT TERM

# --- munge: its own key and socket ---------------------------------------------------------------
dd if=/dev/urandom of="$tmp/munge-key/munge.key" bs=1024 count=1 status=none
chmod 600 "$tmp/munge-key/munge.key"
munged --foreground --force --socket="$tmp/munge/munge.socket" --key-file="$tmp/munge-key/munge.key" \
  --pid-file="$tmp/munge/munged.pid" --seed-file="$tmp/munge-key/munged.seed" \
  --log-file="$tmp/log/munged.log" >"$tmp/log/munged.out.log" 2>&1 &
pids+=($!)
for ((i = 0; i < 50; i++)); do
  [ -S "$tmp/munge/munge.socket" ] && break
  kill -0 "${pids[0]}" 2>/dev/null || fail "munged exited at start-up"
  sleep 0.2
done
munge --socket="$tmp/munge/munge.socket" -n | unmunge --socket="$tmp/munge/munge.socket" >/dev/null ||
  fail "munge does not encode and decode with the test's key"

# --- Slurm: one controller and three nodes on this host ------------------------------------------
cpus="$(nproc)"
cat >"$SLURM_CONF" <<EOF
ClusterName=cohort-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$tmp/munge/munge.socket
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool/%n
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd-%n.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd-%n.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
NodeName=$host NodeHostname=$host NodeAddr=127.0.0.1 Port=$d0_port CPUs=$cpus State=UNKNOWN
NodeName=$host-c1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$d1_port CPUs=$cpus State=UNKNOWN
NodeName=$host-c2 NodeHostname=$host NodeAddr=127.0.0.1 Port=$d2_port CPUs=$cpus State=UNKNOWN
PartitionName=cohort Nodes=ALL Default=YES MaxTime=30 State=UP
EOF
# No cgroups: proctrack/linuxproc and task/none need none, and cgroup.conf is not read.
nodes=("$host" "$host-c1" "$host-c2")
for n in "${nodes[@]}"; do mkdir -p "$tmp/spool/$n"; done

slurmctld -D -f "$SLURM_CONF" >"$tmp/log/slurmctld.out.log" 2>&1 &
pids+=($!)
for ((i = 0; i < 30; i++)); do
  kill -0 "${pids[1]}" 2>/dev/null || fail "slurmctld exited at start-up"
  ping="$(timeout 5 scontrol ping 2>&1 || true)"
  [[ "$ping" == *"is UP"* ]] && break
  sleep 1
done
[[ "$ping" == *"is UP"* ]] || fail "slurmctld did not answer within 30 s: $ping"
config="$(timeout 5 scontrol show config 2>&1 || true)"
grep -q '^MULTIPLE_SLURMD *= *Yes' <<<"$config" ||
  fail "this Slurm is built without multiple-slurmd support (scontrol show config: MULTIPLE_SLURMD)"
for n in "${nodes[@]}"; do
  slurmd -D -f "$SLURM_CONF" -N "$n" >"$tmp/log/slurmd-$n.out.log" 2>&1 &
  pids+=($!)
done

# The three nodes idle (bounded: 60 s).
idle=0
for ((i = 0; i < 60; i++)); do
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null || fail "a Slurm daemon (pid $pid) exited at start-up"; done
  idle="$(timeout 5 sinfo -h -N -o '%N %T' 2>/dev/null | grep -c ' idle$' || true)"
  [ "$idle" -eq 3 ] && break
  sleep 1
done
[ "$idle" -eq 3 ] || fail "the nodes did not become idle within 60 s: $(timeout 5 sinfo -N 2>&1)"
log "cluster up: $(timeout 5 sinfo -h -N -o '%N:%T' | tr '\n' ' ')"

# --- The jobs -------------------------------------------------------------------------------------
# job_env ROUNDS: the jobs' --export (the marker, the binaries, free ports, short waits).
job_env() {
  echo "ALL,$marker,COHORT_BIN=$bin_dir,COHORT_PORT=$cohort_port,COHORT_READY_TIMEOUT=60,COHORT_SHUTDOWN_GRACE=30,COHORT_SERVER_ARGS=--server.rounds=$1 --server.work=fixed --train.steps=10 --server.round_deadline_ms=30000"
}
# run_job NAME NODES: submits cohort.sbatch and checks what it left.
# submit DIR NODES ROUNDS: submits cohort.sbatch from DIR and prints the job id.
submit() {
  (cd "$1" && timeout 30 sbatch --parsable --job-name=cohort-slurm-test --nodes="$2" --time=5 \
    --output="$1/job.out" --export="$(job_env "$3")" "$sbatch_script") ||
    fail "sbatch --nodes=$2 failed"
}
# wait_gone ID SECONDS: waits until job ID has left the queue (squeue shows pending, running and
# completing jobs; its record stays for scontrol for MinJobAge, 300 s).
wait_gone() {
  local i
  for ((i = 0; i < $2; i++)); do
    [ -z "$(timeout 5 squeue -h -j "$1" -o %i 2>/dev/null)" ] && return 0
    sleep 1
  done
  [ -z "$(timeout 5 squeue -h -j "$1" -o %i 2>/dev/null)" ] || fail "job $1 still in the queue after $2 s"
}
run_job() {
  local name="$1" count="$2" dir="$tmp/submit/$1" id start info
  mkdir -p "$dir"
  start=$SECONDS
  id="$(submit "$dir" "$count" "$rounds")"
  wait_gone "$id" 240
  info="$(timeout 5 scontrol show job "$id" 2>&1 || true)"
  cp "$dir/job.out" "$tmp/submit/$name.out" 2>/dev/null || true
  [[ "$info" == *"JobState=COMPLETED "*"ExitCode=0:0"* ]] ||
    fail "job $name (--nodes=$count) did not complete with exit code 0: $(grep -o 'JobState=[^ ]*\|ExitCode=[^ ]*' <<<"$info" | tr '\n' ' ')"
  log "job $name (--nodes=$count) completed in $((SECONDS - start)) s"
  local out="$dir/job.out" metrics=("$dir"/cohort-metrics-*.jsonl)
  grep -q "clients finished (exit status 0)" "$out" || fail "job $name: the clients did not exit 0"
  grep -q "shards finished (exit status 0)" "$out" || fail "job $name: the shards did not exit 0"
  grep -q "training finished: $rounds rounds" "$out" || fail "job $name: no 'training finished: $rounds rounds'"
  grep -qF "$3" "$out" || fail "job $name: not the expected placement '$3'"
  [ -f "${metrics[0]}" ] || fail "job $name: no metrics file in $dir"
  [ "$(grep -c '"event":"round"' "${metrics[0]}")" -eq "$rounds" ] ||
    fail "job $name: ${metrics[0]} does not hold $rounds round records"
  grep -q "\"event\":\"done\",\"rounds\":$rounds," "${metrics[0]}" || fail "job $name: ${metrics[0]} has no done record"
  for s in 0 1; do
    ls "$dir/cohort-checkpoints/shard-$s/"*.ckpt >/dev/null 2>&1 || fail "job $name: no checkpoint of shard $s"
  done
  ! ls -d "$dir"/.cohort-pki-* >/dev/null 2>&1 || fail "job $name left its certificate folder"
}
run_job one-node 1 "2 shard(s) on $host; 2 client(s) on $host; "
run_job three-nodes 3 "2 shard(s) on $host; 4 client(s) on $host-c1 $host-c2; "

# scancel_job: a long federation on one node, cancelled once it has run two rounds. The script's
# trap removes the certificate folder; Slurm stops the shards and clients.
scancel_job() {
  local dir="$tmp/submit/scancel" id metrics=() i done_rounds=0
  mkdir -p "$dir"
  id="$(submit "$dir" 1 100000)"
  for ((i = 0; i < 120; i++)); do
    metrics=("$dir"/cohort-metrics-*.jsonl)
    [ -f "${metrics[0]}" ] && done_rounds="$(grep -c '"event":"round"' "${metrics[0]}" || true)"
    [ "$done_rounds" -ge 2 ] && break
    [ -n "$(timeout 5 squeue -h -j "$id" -o %i 2>/dev/null)" ] || fail "job $id ended before it was cancelled"
    sleep 1
  done
  [ "$done_rounds" -ge 2 ] || fail "job $id did not run two rounds within 120 s"
  [ -d "$dir/.cohort-pki-$id" ] || fail "job $id runs without its certificate folder"
  [ -n "$(job_pids)" ] || fail "job $id runs but no process of it was found"
  timeout 10 scancel "$id" || fail "scancel $id failed"
  wait_gone "$id" 90
  cp "$dir/job.out" "$tmp/submit/scancel.out" 2>/dev/null || true
  [ ! -e "$dir/.cohort-pki-$id" ] || fail "job $id left its certificate folder after scancel"
  [ -z "$(job_pids)" ] || fail "processes of job $id outlived scancel: $(job_pids | tr '\n' ' ')"
  log "job scancel: cancelled after $done_rounds rounds; certificate folder and processes gone"
}
scancel_job
log "ok: cohort.sbatch ran $rounds rounds with 2 shards on one node (shared with 2 clients) and on three nodes (4 clients), and cleaned up after scancel"

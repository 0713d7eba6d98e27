#!/usr/bin/env bash
# Slurm batch jobs on a real Slurm: a private munged + slurmctld + slurmd for this one node
# (4 CPUs declared, cons_tres CR_CPU, everything under the temp dir, ports found free) runs
# configs/slurm/cpu-smoke.sbatch. (a) sbatch --wait with 2 tasks trains to completion with the
# losses of a 2-process ctrain-launch run; (b) `srun -n1 ctrain-launch --nproc_per_node 2` takes
# its layout from Slurm and trains (and refuses 2 launchers on one node; a simulated 2-node step
# derives node rank, master address, port and run id); (c) `scancel --signal=USR1 --batch`:
# every rank stops at the same step, a checkpoint is saved, the job's own trap requeues it and
# the requeued run continues the loss curve of an uninterrupted run exactly; (d) a plain scancel
# (SIGTERM) also leaves a checkpoint. Exits 77 only when the Slurm packages cannot be installed.
source "$(dirname "$0")/lib.sh"
SRC=${CT_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
LAUNCH=$(dirname "$CTRAIN")/ctrain-launch
BIN=$(cd "$(dirname "$CTRAIN")" && pwd)
SB=$SRC/configs/slurm

# ---- the job scripts themselves (no Slurm needed)
for f in single-node per-gpu multi-node cpu-smoke; do
  s=$SB/$f.sbatch
  check "$f.sbatch parses (bash -n)" bash -n "$s"
  check "$f.sbatch: USR1 to the batch shell 120 s early, requeue, a log per job" \
    bash -c "grep -q '^#SBATCH --signal=B:USR1@120\$' '$s' && grep -q '^#SBATCH --requeue\$' '$s' &&
             grep -q '^#SBATCH --output=logs/%x-%j.out\$' '$s' && grep -q '^#SBATCH --open-mode=append\$' '$s' &&
             grep -q 'train.resume=auto' '$s'"
  sed -n '/^# ---- pre-emption/,/^# ---- end of pre-emption block/p' "$s" >"$TMP/block_$f"
done
check "the pre-emption block is the same in the four scripts" bash -c \
  "[ \$(wc -l <'$TMP/block_cpu-smoke') -gt 20 ] && cmp -s '$TMP/block_cpu-smoke' '$TMP/block_single-node' &&
   cmp -s '$TMP/block_cpu-smoke' '$TMP/block_per-gpu' && cmp -s '$TMP/block_cpu-smoke' '$TMP/block_multi-node'"
check "multi-node.sbatch: master = first host of the allocation, a per-job port and run id" bash -c \
  "grep -q 'scontrol show hostnames \"\$SLURM_JOB_NODELIST\" | head -n 1' '$SB/multi-node.sbatch' &&
   grep -q 'SLURM_JOB_ID % 1000' '$SB/multi-node.sbatch' && grep -q -- '--run_id=\"slurm-\$SLURM_JOB_ID\"' '$SB/multi-node.sbatch'"

# ---- ctrain-launch's layout from a simulated 2-node srun step (node 1 of 2 on this machine)
sim_id=$((1000 + RANDOM % 30000))
for node in 0 1; do
  env SLURM_JOB_ID=$sim_id SLURM_STEP_ID=0 SLURM_PROCID=$node SLURM_NODEID=$node SLURM_STEP_NUM_NODES=2 \
    SLURM_STEP_NUM_TASKS=2 SLURM_STEP_NODELIST=localhost,localhost SLURM_JOB_NODELIST=localhost,localhost \
    "$LAUNCH" --nproc_per_node 2 --rdzv_timeout 20 --cmd sh -c "env > '$TMP/sim_env_${node}_'\$LOCAL_RANK" \
    >"$TMP/sim_$node.log" 2>&1 &
done
wait %1; a=$?; wait %2; b=$?
envof() { sed -n "s/^$2=//p" "$TMP/sim_env_$1" 2>/dev/null; }
check "simulated 2-node srun step: both launchers finish (exit $a $b)" test "$a" -eq 0 -a "$b" -eq 0
check "  node 1 took --node_rank 1 from SLURM_NODEID: ranks 2, 3 of 4" \
  test "$(envof 1_0 RANK) $(envof 1_1 RANK) $(envof 1_1 WORLD_SIZE) $(envof 1_1 GROUP_RANK)" = "2 3 4 1"
check "  master = first host of the node list, port 29500 + job id % 1000, run id slurm-<job id>" \
  test "$(envof 1_0 MASTER_ADDR) $(envof 1_0 MASTER_PORT) $(envof 1_0 CTRAIN_RUN_ID)" = \
       "localhost $((29500 + sim_id % 1000)) slurm-$sim_id"
env SLURM_JOB_ID=7 SLURM_STEP_ID=0 SLURM_PROCID=0 SLURM_NODEID=0 SLURM_STEP_NUM_NODES=1 SLURM_STEP_NUM_TASKS=2 \
  SLURM_STEP_NODELIST=localhost "$LAUNCH" --nproc_per_node 2 --cmd true >/dev/null 2>"$TMP/err"
rc=$?
check "two launchers on one node: exit 2 (got $rc), saying one per node" \
  bash -c "[ $rc -eq 2 ] && grep -q 'start one ctrain-launch per node' '$TMP/err'"

# ---- a private Slurm for this node
slurm_missing() { for c in sbatch srun scontrol sinfo squeue scancel slurmctld slurmd munged; do
  command -v "$c" >/dev/null || { echo "$c: not found in PATH" >>"$TMP/apt.log"; return 0; }; done; return 1; }
if slurm_missing; then
  pkgs="slurmctld slurmd slurm-client munge"
  if [ "$(id -u)" -ne 0 ]; then
    echo "SKIP: Slurm is not installed and this is not root (apt-get install -y $pkgs)"
    exit 77
  fi
  echo "installing $pkgs"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq --no-install-recommends $pkgs >"$TMP/apt.log" 2>&1 &&
     ! { apt-get update -qq >>"$TMP/apt.log" 2>&1 &&
         apt-get install -y -qq --no-install-recommends $pkgs >>"$TMP/apt.log" 2>&1; } || slurm_missing; then
    echo "SKIP: the Slurm packages could not be installed ($pkgs):"
    tail -5 "$TMP/apt.log" | sed 's/^/    /'
    exit 77
  fi
fi
make_data "$TMP/data" || exit 1

S=$TMP/slurm
mkdir -p "$S/munge" "$S/run" "$S/state" "$S/spool" "$S/log" "$TMP/jobs/logs"
chmod 755 "$TMP" "$S" "$S/run" # munged wants its socket's directory reachable by everyone
chmod 700 "$S/munge"
stop_slurm() {
  if [ -f "$S/run/slurmctld.pid" ]; then # our jobs first: their processes are under slurmd, not us
    scancel --partition=debug >/dev/null 2>&1
    for i in $(seq 1 50); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.2; done
  fi
  local f pid
  for f in "$S/run/slurmd.pid" "$S/run/slurmctld.pid" "$S/run/munged.pid"; do
    pid=$(cat "$f" 2>/dev/null) || continue
    [ -n "$pid" ] && kill "$pid" 2>/dev/null || continue
    for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null
  done
}
trap 'stop_slurm; rm -rf "$TMP"' EXIT
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && ! ss -Htln "sport = :$1" 2>/dev/null | grep -q .; }
for i in $(seq 1 100); do # two free ports next to each other; another test instance may hold ours
  P=$((17000 + (RANDOM % 4000) * 2))
  port_free "$P" && port_free $((P + 1)) && break
done
head -c 1024 /dev/urandom >"$S/munge/munge.key"
chmod 400 "$S/munge/munge.key"
munged --key-file="$S/munge/munge.key" --socket="$S/run/munge.sock" --pid-file="$S/run/munged.pid" \
  --log-file="$S/log/munged.log" --seed-file="$S/munge/seed" >"$S/log/munged.out" 2>&1
H=$(hostname -s)
cat >"$S/slurm.conf" <<EOF
ClusterName=ctraintest
SlurmctldHost=$H(127.0.0.1)
SlurmUser=$(id -un)
SlurmdUser=$(id -un)
SlurmctldPort=$P
SlurmdPort=$((P + 1))
AuthType=auth/munge
AuthInfo=socket=$S/run/munge.sock
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool
SlurmctldPidFile=$S/run/slurmctld.pid
SlurmdPidFile=$S/run/slurmd.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdParameters=config_overrides
FirstJobId=$((100 + RANDOM % 800))
NodeName=$H NodeAddr=127.0.0.1 CPUs=4 RealMemory=8000
PartitionName=debug Nodes=$H Default=YES State=UP OverSubscribe=FORCE
EOF
export SLURM_CONF=$S/slurm.conf
unset SLURM_JOB_ID SLURM_JOBID SLURM_PROCID SLURM_STEP_ID # in case this test itself runs in a job
slurmctld >"$S/log/slurmctld.out" 2>&1
slurmd >"$S/log/slurmd.out" 2>&1
up=no
for i in $(seq 1 150); do
  [ "$(sinfo -h -o %t 2>/dev/null)" = idle ] && { up=yes; break; }
  sleep 0.2
done
check "slurmctld + slurmd up on ports $P, $((P + 1)): the node is idle" test $up = yes
if [ $up != yes ]; then
  for f in munged slurmctld slurmd; do echo "--- $f log"; tail -5 "$S/log/$f.log"; done
  finish
fi

args=("$SRC/configs/smoke.toml" "data.train=$TMP/data/train.h5" "data.val=$TMP/data/val.h5"
      model.n_layer=2 model.d_model=64 model.max_seq_len=64 train.seq_len=64 train.micro_batch=4
      train.eval_every=5 train.eval_steps=2 train.sample_tokens=0 train.warmup_steps=2
      train.max_steps=10 train.threads=1)
state() { scontrol show job "$1" 2>/dev/null | grep -oE "$2=[^ ]+" | head -1 | cut -d= -f2; }
wait_state() { # wait_state JOB SECONDS STATE...: until the job is in one of the states
  local j=$1 n=$(($2 * 5)) s
  shift 2
  for i in $(seq 1 $n); do
    s=$(state "$j" JobState)
    for w in "$@"; do [ "$s" = "$w" ] && return 0; done
    sleep 0.2
  done
  echo "  job $j still $s"
  return 1
}
submit() { # submit OUT_DIR key=value...: prints the job id
  local out=$1
  shift
  (cd "$TMP/jobs" && CTRAIN_BIN=$BIN sbatch --parsable "$SB/cpu-smoke.sbatch" "${args[@]}" "train.out_dir=$out" "$@")
}
log_of() { echo "$TMP/jobs/logs/ctrain-cpu-$1.out"; }

# (a) sbatch --wait: 2 tasks on 1 node == a 2-process ctrain-launch run
"$LAUNCH" --nproc_per_node 2 --standalone "${args[@]}" "train.out_dir=$TMP/launch" >"$TMP/launch.log" 2>&1
check "reference: ctrain-launch --nproc_per_node 2 (exit $?)" test -f "$TMP/launch/ckpt/latest/state.h5"
ja=$(cd "$TMP/jobs" && CTRAIN_BIN=$BIN timeout 120 sbatch --parsable --wait "$SB/cpu-smoke.sbatch" "${args[@]}" \
     "train.out_dir=$TMP/a")
rc=$?
check "(a) sbatch --wait cpu-smoke.sbatch: job $ja completed (exit $rc)" \
  test "$rc" -eq 0 -a "$(state "$ja" JobState)" = COMPLETED
check "(a) the job log shows 2 ranks via slurm on one node" \
  grep -q 'distributed: rank 0/2 (local 0/2, node 0/1) via slurm' "$(log_of "$ja")"
check "(a) 10 steps logged" test "$(field "$TMP/a" tokens_per_s | wc -l)" -eq 10
check "(a) sbatch == ctrain-launch: losses within 1e-6" close "$TMP/launch" "$TMP/a" loss 1e-6

# (b) one ctrain-launch per node under srun: the layout comes from Slurm
timeout 120 srun -n1 -c2 "$LAUNCH" --nproc_per_node 2 "${args[@]}" "train.out_dir=$TMP/b" >"$TMP/b.log" 2>&1
rc=$?
check "(b) srun -n1 ctrain-launch --nproc_per_node 2 trains (exit $rc)" test "$rc" -eq 0
check "(b) it took its layout and run id from Slurm (node 0 of 1, world 2, run id slurm-<job>)" \
  grep -qE 'starting 2 workers on node 0 of 1 \(world size 2\), store 127\.0\.0\.1:[0-9]+, run id slurm-[0-9]+$' "$TMP/b.log"
check "(b) srun + ctrain-launch == ctrain-launch: losses within 1e-6" close "$TMP/launch" "$TMP/b" loss 1e-6
timeout 60 srun -n2 "$LAUNCH" --nproc_per_node 1 "${args[@]}" "train.out_dir=$TMP/b2" >"$TMP/b2.log" 2>&1
rc=$?
check "(b) srun -n2 ctrain-launch on one node is refused (exit $rc) with a hint" \
  bash -c "[ $rc -eq 2 ] && grep -q 'start one ctrain-launch per node (srun --ntasks-per-node=1' '$TMP/b2.log'"

# (c) pre-emption: SIGUSR1 to the batch shell; the trap checkpoints, requeues, the rerun resumes
long=(train.max_steps=300 train.checkpoint_every=10)
timeout 300 srun -n2 "$CTRAIN" train "${args[@]}" "${long[@]}" "train.out_dir=$TMP/ref" >"$TMP/ref.log" 2>&1
check "reference: srun -n2 ctrain train, 300 steps uninterrupted (exit $?)" test "$(losses "$TMP/ref" | wc -l)" -eq 300
jc=$(submit "$TMP/pre" "${long[@]}")
for i in $(seq 1 600); do [ -e "$TMP/pre/ckpt/latest" ] && break; sleep 0.1; done
check "(c) job $jc reached its first checkpoint" test -e "$TMP/pre/ckpt/latest"
scancel --signal=USR1 --batch "$jc"
# Slurm holds a requeued batch job back for a while (2 minutes here) before it is eligible;
# the trap has done the requeue, the test only lets it start at once
requeued=no
for i in $(seq 1 300); do
  if [ "$(state "$jc" Restarts)" = 1 ] && [ "$(state "$jc" JobState)" = PENDING ]; then
    requeued=yes
    scontrol update JobId="$jc" StartTime=now
    break
  fi
  sleep 0.1
done
log=$(log_of "$jc")
stop=$(sed -n 's/.*SIGUSR1: stopped at step \([0-9]*\) after saving a checkpoint.*/\1/p' "$log" | head -1)
check "(c) SIGUSR1: the run stopped at step ${stop:-?} with a checkpoint of that step" \
  test -n "$stop" -a -f "$TMP/pre/ckpt/step_$(printf %08d "${stop:-0}")/state.h5"
check "(c) every rank stopped there: the step exited 0 (no rank failed or hung)" \
  bash -c "grep -q 'checkpoint written; requeueing job $jc' '$log' && ! grep -q 'srun: error' '$log'"
check "(c) the job's trap requeued it (scontrol requeue: Restarts=1, PENDING)" test $requeued = yes
wait_state "$jc" 120 COMPLETED FAILED CANCELLED
check "(c) the requeued run completed" test "$(state "$jc" JobState)" = COMPLETED
if [ "$(state "$jc" JobState)" != COMPLETED ]; then # why: the job, its log, slurmctld's view
  scontrol show job "$jc" | grep -E "JobState|Restarts|ExitCode|Reason" | sed 's/^/  /'
  tail -25 "$log" | sed 's/^/  log: /'
  grep -F "JobId=$jc" "$S/log/slurmctld.log" | tail -12 | sed 's/^/  slurmctld: /'
fi
check "(c) the requeued job ran its script again as restart 1" grep -q "job $jc (restart 1)" "$log"
check "(c) the rerun resumed from step ${stop:-?}" grep -qE "resumed from .* at step ${stop:-x}( |\$)" "$log"
check "(c) pre-empted + requeued == uninterrupted (step, loss, lr, grad_norm as exact floats)" \
  diff <(losses "$TMP/ref") <(losses "$TMP/pre")
check "(c) validation losses identical too" diff <(grep val_loss "$TMP/ref/metrics.jsonl") <(grep val_loss "$TMP/pre/metrics.jsonl")

# (d) scancel (SIGTERM, then SIGKILL after KillWait): a checkpoint all the same
jd=$(submit "$TMP/term" train.max_steps=100000 train.checkpoint_every=10)
for i in $(seq 1 600); do [ -e "$TMP/term/ckpt/latest" ] && break; sleep 0.1; done
scancel "$jd"
wait_state "$jd" 60 CANCELLED
log=$(log_of "$jd")
for i in $(seq 1 50); do [ "$(grep -c 'interrupted by SIGTERM' "$log")" -ge 2 ] && break; sleep 0.1; done
stop=$(sed -n 's/.*SIGTERM: stopped at step \([0-9]*\) after saving a checkpoint.*/\1/p' "$log" | head -1)
check "(d) scancel: job $jd cancelled, not requeued" \
  test "$(state "$jd" JobState)" = CANCELLED -a "$(state "$jd" Restarts)" = 0
check "(d) SIGTERM: stopped at step ${stop:-?} with a checkpoint of that step" \
  test -n "$stop" -a -f "$TMP/term/ckpt/step_$(printf %08d "${stop:-0}")/state.h5"
check "(d) both ranks stopped at that step" \
  test "$(grep -c "interrupted by SIGTERM at step ${stop:-x} (checkpoint saved)" "$log")" -eq 2
check "(d) no process of the run remains" bash -c "! pgrep -f '[t]rain.out_dir=$TMP/term' >/dev/null"
finish

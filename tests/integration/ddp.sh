#!/usr/bin/env bash
# Data-parallel training on CPUs: 2 ranks under ctrain-launch == 1 rank with gradient
# accumulation 2 (same global batch) for 10 steps; a worker killed mid-run with
# --max_restarts=1 ends in a run whose final loss equals an uninterrupted run's exactly;
# SIGUSR1 to the launcher leaves a checkpoint and a clean exit; SIGTERM stops everything within
# the grace period after a checkpoint; mpirun and a simulated Slurm step train too.
source "$(dirname "$0")/lib.sh"
SRC=${CT_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
LAUNCH=$(dirname "$CTRAIN")/ctrain-launch
make_data "$TMP/data" || exit 1
args=("$SRC/configs/smoke.toml" "data.train=$TMP/data/train.h5" "data.val=$TMP/data/val.h5"
      model.n_layer=2 model.d_model=64 model.max_seq_len=64 train.seq_len=64 train.micro_batch=4
      train.eval_every=5 train.eval_steps=2 train.sample_tokens=0 train.warmup_steps=2
      train.max_steps=10 train.threads=1)
# compare two columns of numbers to a relative tolerance

"$CTRAIN" train "${args[@]}" train.grad_accum=2 "train.out_dir=$TMP/one" >/dev/null 2>&1
"$LAUNCH" --nproc_per_node 2 --standalone "${args[@]}" "train.out_dir=$TMP/two" >"$TMP/two.log" 2>&1
check "2 ranks under ctrain-launch train (exit 0)" test $? -eq 0
check "rank-prefixed console lines" grep -q '^\[rank0\]: ' "$TMP/two.log"
check "one metrics writer: 10 step lines" test "$(field "$TMP/two" tokens_per_s | wc -l)" -eq 10
check "2 ranks == 1 rank x 2 accumulation: losses within 1e-5" close "$TMP/one" "$TMP/two" loss 1e-5
check "gradient norms within 1e-5" close "$TMP/one" "$TMP/two" grad_norm 1e-4

# parallel.sparse_embedding_grad = true (parallel/ddp.h; off by default): the embedding lookup's
# gradient travels as the rows the step's tokens use, the embedding's own gradient early; off,
# the whole embedding is one bucket at the end. Both equal the one-process run; they round the
# two shares apart (a few ulps)
check "sparse_embedding_grad off by default: the log names no rows" \
  bash -c "! grep -q 'lookup.s gradient reduced as' '$TMP/two.log'"
"$LAUNCH" --nproc_per_node 2 --standalone "${args[@]}" parallel.sparse_embedding_grad=true \
  "train.out_dir=$TMP/sparse" >"$TMP/sparse.log" 2>&1
check "parallel.sparse_embedding_grad = true trains (exit $?)" test $? -eq 0
check "the lookup's gradient went as rows (of the 320 padded)" \
  grep -qE "embedding lookup's gradient reduced as the [0-9]+ of 320 rows" "$TMP/sparse.log"
check "sparse_embedding_grad = true == 1 rank x 2 accumulation: losses within 1e-5" \
  close "$TMP/one" "$TMP/sparse" loss 1e-5
check "sparse == dense embedding gradient: losses within 1e-6" close "$TMP/two" "$TMP/sparse" loss 1e-6
check "sparse == dense embedding gradient: final weights within 1e-5" same_weights "$TMP/two" "$TMP/sparse" 1e-5
check "sparse == 1 rank: final weights within 1e-4" same_weights "$TMP/one" "$TMP/sparse" 1e-4

# gradients on the wire in bf16 (torch DDP's bf16_compress_hook): each bucket rounded once, so the
# losses stay within 1e-2 of the fp32 reduce, and the log says which dtype travelled
"$LAUNCH" --nproc_per_node 2 --standalone "${args[@]}" parallel.reduce_dtype=bf16 parallel.bucket_mb=0.01 \
  "train.out_dir=$TMP/bf16" >"$TMP/bf16.log" 2>&1
check "reduce_dtype = bf16 trains (exit 0)" test $? -eq 0
check "bf16 reduce: losses within 1e-2 of the fp32 reduce" close "$TMP/two" "$TMP/bf16" loss 1e-2
check "bf16 reduce: not bit-identical to fp32 (the rounding happened)" \
  bash -c "! cmp -s <(grep -o '\"loss\": [^,]*' '$TMP/two/metrics.jsonl') <(grep -o '\"loss\": [^,]*' '$TMP/bf16/metrics.jsonl')"
check "bf16 reduce: the log names it" grep -qE "all-reduced in [0-9]+ buckets of bf16" "$TMP/bf16.log"
"$CTRAIN" train "${args[@]}" parallel.data=zero2 parallel.reduce_dtype=bf16 "train.out_dir=$TMP/bad" \
  >"$TMP/bad.log" 2>&1
rc=$?
check "reduce_dtype = bf16 with zero2 is refused (exit $rc) naming the keys" \
  bash -c "[ $rc -ne 0 ] && grep -q 'parallel.reduce_dtype = \"bf16\" works with parallel.data = \"ddp\"' '$TMP/bad.log'"

# parallel.overlap = false: every bucket is all-reduced after backward (small buckets here, so there
# are several), the same sums as overlapped: bit-identical losses and weights on CPU; mixing it
# with a way of overlapping is refused, naming the keys
"$LAUNCH" --nproc_per_node 2 --standalone "${args[@]}" parallel.overlap=false parallel.bucket_mb=0.01 \
  "train.out_dir=$TMP/after" >"$TMP/after.log" 2>&1
check "overlap = false trains (exit $?)" test $? -eq 0
check "overlap = false: the log says the buckets went after backward" \
  grep -qE "all-reduced in [0-9]+ buckets of fp32 \(parallel.bucket_mb = 0.01\) after backward" "$TMP/after.log"
check "overlap = false == overlapped: losses equal" close "$TMP/two" "$TMP/after" loss 0
check "overlap = false == overlapped: final weights equal" same_weights "$TMP/two" "$TMP/after" 0
"$CTRAIN" train "${args[@]}" parallel.overlap=false parallel.sparse_embedding_grad=true \
  "train.out_dir=$TMP/bad2" >"$TMP/bad2.log" 2>&1
rc=$?
check "overlap = false with sparse_embedding_grad is refused (exit $rc) naming the keys" \
  bash -c "[ $rc -ne 0 ] && grep -q 'parallel.overlap = false all-reduces every bucket after backward' '$TMP/bad2.log'"

# kill -9 one worker mid-run; with --max_restarts=1 the run resumes from the last checkpoint
# and ends exactly where an uninterrupted run ends
"$LAUNCH" --nproc_per_node 2 --standalone "${args[@]}" train.max_steps=30 train.checkpoint_every=5 \
  "train.out_dir=$TMP/ref" >/dev/null 2>&1
"$LAUNCH" --nproc_per_node 2 --standalone --max_restarts 1 --grace_period 5 "${args[@]}" \
  train.max_steps=30 train.checkpoint_every=5 "train.out_dir=$TMP/killed" >"$TMP/killed.log" 2>&1 &
lpid=$!
for i in $(seq 1 600); do  # wait until step 12 is logged, then kill rank 1
  [ "$(field "$TMP/killed" tokens_per_s 2>/dev/null | wc -l)" -ge 12 ] && break
  sleep 0.1
done
victim=$(pgrep -f "train.out_dir=$TMP/killed" -P "$(pgrep -d, -P $lpid)" 2>/dev/null | tail -1)
[ -z "$victim" ] && victim=$(ps -eo pid,args | grep "[t]rain.out_dir=$TMP/killed" | grep -v ctrain-launch | awk 'NR==2{print $1}')
kill -9 "$victim"
wait $lpid
rc=$?
check "restarted run completes (exit $rc)" test "$rc" -eq 0
check "the failure named the rank and SIGKILL" grep -qE 'rank [01].*SIGKILL|SIGKILL.*rank [01]' "$TMP/killed.log"
check "restart resumed from a checkpoint" grep -q 'resumed from' "$TMP/killed.log"
final() { field "$1" loss | tail -1; }
check "final loss equals the uninterrupted run's exactly ($(final "$TMP/ref") vs $(final "$TMP/killed"))" \
  test "$(final "$TMP/ref")" = "$(final "$TMP/killed")"
check "no process of the run remains" bash -c "! pgrep -f '[t]rain.out_dir=$TMP/killed' >/dev/null"

# SIGUSR1 (Slurm's pre-emption warning): checkpoint, clean exit 0
"$LAUNCH" --nproc_per_node 2 --standalone "${args[@]}" train.max_steps=100000 \
  "train.out_dir=$TMP/usr1" >"$TMP/usr1.log" 2>&1 &
lpid=$!
for i in $(seq 1 600); do [ -f "$TMP/usr1/metrics.jsonl" ] && break; sleep 0.1; done
sleep 1
kill -USR1 $lpid
wait $lpid
rc=$?
check "SIGUSR1: clean exit 0 (got $rc)" test "$rc" -eq 0
check "SIGUSR1: a checkpoint exists" test -f "$TMP/usr1/ckpt/latest/state.h5"
# SIGTERM: workers checkpoint and are gone within the grace period
"$LAUNCH" --nproc_per_node 2 --standalone --grace_period 20 "${args[@]}" train.max_steps=100000 \
  "train.out_dir=$TMP/term" >"$TMP/term.log" 2>&1 &
lpid=$!
for i in $(seq 1 600); do [ -f "$TMP/term/metrics.jsonl" ] && break; sleep 0.1; done
sleep 1
start=$(date +%s)
kill -TERM $lpid
wait $lpid
rc=$?
check "SIGTERM: launcher exits non-zero (got $rc) within the grace period" \
  test "$rc" -ne 0 -a $(( $(date +%s) - start )) -le 20
check "SIGTERM: a checkpoint was written" test -f "$TMP/term/ckpt/latest/state.h5"
check "SIGTERM: no worker remains" bash -c "! pgrep -f '[t]rain.out_dir=$TMP/term' >/dev/null"

# a simulated Slurm step: two tasks started by hand with Slurm's variables
for r in 0 1; do
  SLURM_PROCID=$r SLURM_LOCALID=$r SLURM_STEP_ID=0 SLURM_NTASKS=2 SLURM_NNODES=1 SLURM_NODEID=0 SLURM_JOB_ID=$$ \
  SLURM_JOB_NODELIST=localhost MASTER_PORT=$(( 20000 + $$ % 20000 )) \
    "$CTRAIN" train "${args[@]}" "train.out_dir=$TMP/slurm" >"$TMP/slurm_$r.log" 2>&1 &
done
wait %1; a=$?; wait %2; b=$?
check "simulated Slurm (2 tasks) trains (exit $a $b)" test "$a" -eq 0 -a "$b" -eq 0
check "simulated Slurm == ctrain-launch losses" close "$TMP/two" "$TMP/slurm" loss 1e-6

# Open MPI, when installed (Debian openmpi-bin)
if command -v mpirun >/dev/null; then
  mpirun --allow-run-as-root --oversubscribe -np 2 "$CTRAIN" train "${args[@]}" \
    "train.out_dir=$TMP/mpi" >"$TMP/mpi.log" 2>&1
  check "mpirun -np 2 trains (exit $?)" test -f "$TMP/mpi/ckpt/latest/state.h5"
  check "mpirun == ctrain-launch losses" close "$TMP/two" "$TMP/mpi" loss 1e-6
else
  echo "note: mpirun not installed (apt-get install openmpi-bin); Open MPI case not run"
fi
finish

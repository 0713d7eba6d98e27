#!/usr/bin/env bash
# 4- and 8-rank layouts on CPU ranks over Gloo (issues #10 and #11: until 4 and 8 GPUs are lent,
# the CPUs check equivalence). Each layout trains the same losses, gradient norms and validation
# losses (<= 1e-5 relative) and ends with the same weights as one process with the same global
# batch (train.grad_accum = the data-parallel degree):
#   4 ranks: ddp, zero1, zero2, zero3 (dp 4) and tp 4 (dp 1); tp 2 x dp 2 is in tp.sh
#   8 ranks: tp 2 x zero3 dp 4, tp 4 x ddp dp 2, tp 8 (dp 1)
# and a worker killed with kill -9 mid-run on 4 ranks (zero3, --max_restarts=1) resumes from the
# last checkpoint and ends with the uninterrupted run's losses, bit for bit.
# Shapes: n_head = 8 so 2-, 4- and 8-way TP all take whole heads (head_dim 8); d_ff (gpt2 256,
# llama 192) and the padded vocabulary (320) divide by 8. llama keeps GQA (n_kv_head 4) up to
# tp 4; at tp 8 every rank needs a whole kv head, so its llama runs n_kv_head = 8 (no GQA).
# About 40-55 s on 2 cores, most of it the 8-rank TP runs (TP's per-layer collectives over Gloo
# with 8 processes on 2 cores: ~14 s for tp 8).
source "$(dirname "$0")/lib.sh"
SRC=${CT_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
LAUNCH=$(dirname "$CTRAIN")/ctrain-launch
make_data "$TMP/data" || exit 1
args=("$SRC/configs/smoke.toml" "data.train=$TMP/data/train.h5" "data.val=$TMP/data/val.h5"
      model.n_layer=2 model.d_model=64 model.n_head=8 model.max_seq_len=64 train.seq_len=64
      train.micro_batch=4 train.eval_every=5 train.eval_steps=2 train.sample_tokens=0
      train.warmup_steps=2 train.max_steps=10 train.threads=1)
gqa=(model.arch=llama model.n_kv_head=4 model.qk_norm=true model.tie_embeddings=false)
mha=(model.arch=llama model.n_kv_head=8 model.qk_norm=true model.tie_embeddings=false)
# same_weights (lib.sh) at 1e-4: AdamW turns last-bit differences of tiny gradients into up to
# lr-sized steps on a few elements: here one embedding element of llama tp 4 ends 4.3e-5 off
# (the next worst 9e-7), close to tp.sh's 5e-5, and -march=native builds round differently, so
# 1e-4; a wrong cut or batch moves weights by 1e-2 and more (2.7e-2 against the wrong reference).
one() { "$CTRAIN" train "${args[@]}" "$@" >"$TMP/last.log" 2>&1; }
run() { local n=$1; shift; "$LAUNCH" --nproc_per_node "$n" --standalone "${args[@]}" "$@" >"$TMP/last.log" 2>&1; }

# same NAME REF DIR: the run in DIR finished and matches the one-process run REF
same() {
  local rc=$?
  check "$1 trains (exit $rc)" test "$rc" -eq 0 -a -f "$3/ckpt/latest/state.h5"
  check "$1 == 1 process: losses" close "$2" "$3" loss 1e-5
  check "$1 == 1 process: gradient norms" close "$2" "$3" grad_norm 1e-5
  check "$1 == 1 process: validation losses" close "$2" "$3" val_loss 1e-5 2
  check "$1 == 1 process: final weights" same_weights "$2" "$3" 1e-4
}

# one-process references ref-<arch>-<accumulation A>. Each data-parallel rank evaluates eval_steps
# batches of its own windows (global window k * dp + rank) and the ranks average, so dp ranks
# cover the first dp x eval_steps batches: the reference evaluates 2 A batches to see the same ones.
for a in 1 2 4; do
  one train.grad_accum=$a train.eval_steps=$((2 * a)) "train.out_dir=$TMP/ref-gpt2-$a"
  one "${gqa[@]}" train.grad_accum=$a train.eval_steps=$((2 * a)) "train.out_dir=$TMP/ref-gqa-$a"
done
one "${mha[@]}" "train.out_dir=$TMP/ref-mha-1"

# 4 ranks, data parallel 4: the two archs alternate over the four modes
run 4 parallel.data=ddp "train.out_dir=$TMP/ddp4"
same "gpt2 ddp dp 4" "$TMP/ref-gpt2-4" "$TMP/ddp4"
run 4 "${gqa[@]}" parallel.data=zero1 "train.out_dir=$TMP/zero1-4"
same "llama zero1 dp 4" "$TMP/ref-gqa-4" "$TMP/zero1-4"
run 4 parallel.data=zero2 "train.out_dir=$TMP/zero2-4"
same "gpt2 zero2 dp 4" "$TMP/ref-gpt2-4" "$TMP/zero2-4"
run 4 "${gqa[@]}" parallel.data=zero3 "train.out_dir=$TMP/zero3-4"
same "llama zero3 dp 4" "$TMP/ref-gqa-4" "$TMP/zero3-4"
check "zero3 dp 4: 4 weight shards" bash -c "[ \$(ls '$TMP/zero3-4/ckpt/latest/' | grep -c model-rank) -eq 4 ]"

# 4 ranks, tp 4 (dp 1): llama with 2 query heads and 1 kv head per rank
run 4 parallel.tensor=4 "train.out_dir=$TMP/tp4-gpt2"
same "gpt2 tp 4" "$TMP/ref-gpt2-1" "$TMP/tp4-gpt2"
run 4 "${gqa[@]}" parallel.tensor=4 "train.out_dir=$TMP/tp4-llama"
same "llama (GQA) tp 4" "$TMP/ref-gqa-1" "$TMP/tp4-llama"
check "tp 4: 4 weight shards, no tensor in model.h5" bash -c \
  "[ \$(ls '$TMP/tp4-llama/ckpt/latest/' | grep -c model-rank) -eq 4 ] && [ \$(h5ls -r '$TMP/tp4-llama/ckpt/latest/model.h5' | grep -c Dataset) -eq 0 ]"

# 8 ranks
run 8 "${gqa[@]}" parallel.tensor=2 parallel.data=zero3 "train.out_dir=$TMP/tp2-zero3-4"
same "llama tp 2 x zero3 dp 4 (8 ranks)" "$TMP/ref-gqa-4" "$TMP/tp2-zero3-4"
run 8 parallel.tensor=4 parallel.data=ddp "train.out_dir=$TMP/tp4-ddp2"
same "gpt2 tp 4 x ddp dp 2 (8 ranks)" "$TMP/ref-gpt2-2" "$TMP/tp4-ddp2"
run 8 parallel.tensor=8 "train.out_dir=$TMP/tp8-gpt2"
same "gpt2 tp 8 (8 ranks, 1 head each)" "$TMP/ref-gpt2-1" "$TMP/tp8-gpt2"
run 8 "${mha[@]}" parallel.tensor=8 "train.out_dir=$TMP/tp8-llama"
same "llama tp 8 (8 ranks, 1 query + 1 kv head each)" "$TMP/ref-mha-1" "$TMP/tp8-llama"
check "the tp 8 checkpoint records tensor_parallel = 8" \
  bash -c "h5dump -a /tensor_parallel '$TMP/tp8-gpt2/ckpt/latest/state.h5' | grep -q '(0): 8'"

# kill -9 rank 2 of 4 mid-run; with --max_restarts=1 the group restarts from ckpt/latest and ends
# where an uninterrupted run ends
kargs=("${gqa[@]}" parallel.data=zero3 train.max_steps=30 train.checkpoint_every=5)
run 4 "${kargs[@]}" "train.out_dir=$TMP/uninterrupted"
"$LAUNCH" --nproc_per_node 4 --standalone --max_restarts 1 --grace_period 5 "${args[@]}" "${kargs[@]}" \
  "train.out_dir=$TMP/killed" >"$TMP/killed.log" 2>&1 &
lpid=$!
for _ in $(seq 1 1200); do  # until step 12 is logged (checkpoints at 5 and 10 exist), at most 60 s
  [ "$(field "$TMP/killed" tokens_per_s | wc -l)" -ge 12 ] && break
  sleep 0.05
done
victim=
for p in $(pgrep -P $lpid); do  # the worker whose environment says RANK=2
  tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx RANK=2 && victim=$p
done
logged=$(field "$TMP/killed" tokens_per_s | wc -l)
check "rank 2 found and killed with SIGKILL after step $logged of 30" \
  bash -c "[ -n '$victim' ] && [ $logged -lt 30 ] && kill -9 $victim"
latest=$(readlink "$TMP/killed/ckpt/latest")
lstep=$((10#0${latest#step_})) # 0 when there was none
wait $lpid
rc=$?
check "restarted run completes (exit $rc)" test "$rc" -eq 0
check "the failure named rank 2 and SIGKILL" grep -qE 'rank 2.*SIGKILL' "$TMP/killed.log"
step=$(sed -n 's/.*resumed from .* at step \([0-9]*\).*/\1/p' "$TMP/killed.log" | head -1)
# from the checkpoint ckpt/latest named when the worker died (or the next one, if rank 0 was
# finishing it while the others waited for the dead rank), not from step 0
check "restart resumed from the last checkpoint (latest was $latest at the kill, resumed at step ${step:-none})" \
  bash -c "[ '$lstep' -gt 0 ] && [ '${step:-0}' -eq $lstep -o '${step:-0}' -eq $((lstep + 5)) ]"
final() { field "$1" loss | tail -1; }
check "final loss equals the uninterrupted run's exactly ($(final "$TMP/uninterrupted") vs $(final "$TMP/killed"))" \
  bash -c "[ -n '$(final "$TMP/killed")' ] && [ '$(final "$TMP/uninterrupted")' = '$(final "$TMP/killed")' ]"
check "steps after the restart equal the uninterrupted run's bit for bit" \
  diff <(losses "$TMP/uninterrupted" | tail -$((30 - ${step:-0}))) <(losses "$TMP/killed" | tail -$((30 - ${step:-0})))
check "no process of the run remains" bash -c "! pgrep -f '[t]rain.out_dir=$TMP/killed' >/dev/null"
finish

#!/usr/bin/env bash
# Tensor parallelism (parallel.tensor) on CPU ranks over Gloo. tp = 2 on 2 ranks (data parallel
# 1) trains the same losses, gradient norms and validation losses as one process (<= 1e-5
# relative) and ends with the same weights, for the tiny gpt2 (tied vocab-parallel head, biases)
# and llama (GQA: kv heads split, qk_norm, gate_up halves, untied head) models; the 2-D mesh
# tp 2 x dp 2 on 4 ranks (with ddp, zero1, zero2 and zero3) matches one process with the same global
# batch (and, from its sharded checkpoints, the same final weights). Checkpoints are sharded: each
# writing rank puts its weight blocks in model-rank<R>.h5 (no gather; model.h5 holds no tensors)
# and readers reassemble whole tensors: tp 2 -> tp 2 resumes bit-identically, tp 2 -> tp 1,
# tp 1 -> tp 2, zero3@2 -> tp 2 and the 4-rank mesh -> 1 process continue the same losses, and
# generate / export-hf read them. Layouts that cannot work fail with the key named.
source "$(dirname "$0")/lib.sh"
SRC=${CT_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
LAUNCH=$(dirname "$CTRAIN")/ctrain-launch
make_data "$TMP/data" || exit 1
args=("$SRC/configs/smoke.toml" "data.train=$TMP/data/train.h5" "data.val=$TMP/data/val.h5"
      model.n_layer=2 model.d_model=64 model.max_seq_len=64 train.seq_len=64 train.micro_batch=4
      train.eval_every=5 train.eval_steps=2 train.sample_tokens=0 train.warmup_steps=2
      train.max_steps=10 train.threads=1)
llama=(model.arch=llama model.n_kv_head=2 model.qk_norm=true model.tie_embeddings=false)
# Final weights, every tensor within TOL absolute. AdamW turns last-bit differences of tiny
# gradients (split matmul sums) into up to ~lr-sized steps on a few elements, so the TP
# tolerance is 5e-5 with lr 3e-3; a wrong cut moves weights by 1e-2 and more.
# (whole and same_weights: lib.sh)
one() { "$CTRAIN" train "${args[@]}" "$@" >"$TMP/last.log" 2>&1; }
run() { local n=$1; shift; "$LAUNCH" --nproc_per_node "$n" --standalone "${args[@]}" "$@" >"$TMP/last.log" 2>&1; }

for arch in gpt2 llama; do
  extra=()
  [ "$arch" = llama ] && extra=("${llama[@]}")
  one "${extra[@]}" "train.out_dir=$TMP/$arch-one"
  run 2 "${extra[@]}" parallel.tensor=2 "train.out_dir=$TMP/$arch-tp2"
  check "$arch tp=2 trains (exit $?)" test -f "$TMP/$arch-tp2/ckpt/latest/state.h5"
  check "$arch tp=2 == 1 process: losses" close "$TMP/$arch-one" "$TMP/$arch-tp2" loss 1e-5
  check "$arch tp=2 == 1 process: gradient norms" close "$TMP/$arch-one" "$TMP/$arch-tp2" grad_norm 1e-5
  check "$arch tp=2 == 1 process: validation losses" close "$TMP/$arch-one" "$TMP/$arch-tp2" val_loss 1e-5 2
  check "$arch tp=2 == 1 process: final weights" same_weights "$TMP/$arch-one" "$TMP/$arch-tp2" 5e-5
done
check "the tp=2 checkpoint records tensor_parallel = 2" \
  bash -c "h5dump -a /tensor_parallel '$TMP/gpt2-tp2/ckpt/latest/state.h5' | grep -q '(0): 2'"

# 2-D mesh on 4 ranks: tp 2 x dp 2 == one process with accumulation 2
one "${llama[@]}" train.grad_accum=2 "train.out_dir=$TMP/llama-acc"
run 4 "${llama[@]}" parallel.tensor=2 parallel.data=zero3 "train.out_dir=$TMP/mesh-zero3"
check "llama tp 2 x zero3 dp 2 (4 ranks) == 1 process x 2: losses" close "$TMP/llama-acc" "$TMP/mesh-zero3" loss 1e-5
check "llama tp 2 x zero3 dp 2 (4 ranks) == 1 process x 2: gradient norms" close "$TMP/llama-acc" "$TMP/mesh-zero3" grad_norm 1e-5
check "llama tp 2 x zero3 dp 2 (4 ranks) == 1 process x 2: final weights" same_weights "$TMP/llama-acc" "$TMP/mesh-zero3" 5e-5
one train.grad_accum=2 "train.out_dir=$TMP/gpt2-acc"
run 4 parallel.tensor=2 parallel.data=ddp "train.out_dir=$TMP/mesh-ddp"
check "gpt2 tp 2 x ddp dp 2 (4 ranks) == 1 process x 2: losses" close "$TMP/gpt2-acc" "$TMP/mesh-ddp" loss 1e-5
check "gpt2 tp 2 x ddp dp 2 (4 ranks) == 1 process x 2: final weights" same_weights "$TMP/gpt2-acc" "$TMP/mesh-ddp" 5e-5
check "tp 2 x ddp dp 2: 2 weight shards (dp rank 0 of each tp rank), no tensor in model.h5" bash -c \
  "[ \$(ls '$TMP/mesh-ddp/ckpt/latest/' | grep -c model-rank) -eq 2 ] && [ \$(h5ls -r '$TMP/mesh-ddp/ckpt/latest/model.h5' | grep -c Dataset) -eq 0 ]"
run 4 "${llama[@]}" parallel.tensor=2 parallel.data=zero2 "train.out_dir=$TMP/mesh-zero2"
check "llama tp 2 x zero2 dp 2 (4 ranks) == 1 process x 2: losses" close "$TMP/llama-acc" "$TMP/mesh-zero2" loss 1e-5
check "llama tp 2 x zero2 dp 2 (4 ranks) == 1 process x 2: final weights" same_weights "$TMP/llama-acc" "$TMP/mesh-zero2" 5e-5
run 4 parallel.tensor=2 parallel.data=zero1 "train.out_dir=$TMP/mesh-zero1"
check "gpt2 tp 2 x zero1 dp 2 (4 ranks) == 1 process x 2: losses" close "$TMP/gpt2-acc" "$TMP/mesh-zero1" loss 1e-5
check "tp 2 x zero1 dp 2: 4 weight shards (each rank its ZeRO slice of its tp rank's weights)" bash -c \
  "[ \$(ls '$TMP/mesh-zero1/ckpt/latest/' | grep -c model-rank) -eq 4 ]"
check "gpt2 tp 2 x zero1 dp 2 (4 ranks) == 1 process x 2: final weights" same_weights "$TMP/gpt2-acc" "$TMP/mesh-zero1" 5e-5

# checkpoints across tensor-parallel degrees
resume() { # resume NAME REF FROM_NPROC "FROM ARGS" TO_NPROC "TO ARGS"
  local dir=$TMP/r-$1
  if [ "$3" = 1 ]; then one $4 train.stop_after=5 "train.out_dir=$dir"; else run "$3" $4 train.stop_after=5 "train.out_dir=$dir"; fi
  if [ "$5" = 1 ]; then one $6 train.resume=auto "train.out_dir=$dir"; else run "$5" $6 train.resume=auto "train.out_dir=$dir"; fi
  check "$1: resumed at step 5" grep -q "resumed from .* at step 5" "$TMP/last.log"
  check "$1: continues the same losses" close "$2" "$dir" loss 1e-5
  check "$1: same final weights" same_weights "$2" "$dir" 5e-5
}
resume "tp2@2 -> tp1@1" "$TMP/gpt2-one" 2 "parallel.tensor=2" 1 ""
resume "tp1@1 -> tp2@2" "$TMP/gpt2-one" 1 "" 2 "parallel.tensor=2"
resume "tp2@2 -> tp2@2" "$TMP/gpt2-one" 2 "parallel.tensor=2" 2 "parallel.tensor=2"
check "tp2@2 -> tp2@2: the same losses as the uninterrupted tp=2 run, bit for bit" \
  close "$TMP/gpt2-tp2" "$TMP/r-tp2@2 -> tp2@2" loss 0
tpck="$TMP/r-tp2@2 -> tp1@1/ckpt/step_00000005"
check "tp=2 checkpoint: no tensor in model.h5, weight_shards = 2, both halves of the qkv weights" bash -c \
  "[ \$(h5ls -r '$tpck/model.h5' | grep -c Dataset) -eq 0 ] && h5dump -a /weight_shards '$tpck/model.h5' | grep -q '(0): 2' &&
   h5ls -r '$tpck/model-rank00000.h5' | grep -q '^/w/h.0.attn.c_attn.weight/0 ' && h5ls -r '$tpck/model-rank00001.h5' | grep -q '^/w/h.0.attn.c_attn.weight/0 '"
"$CTRAIN" consolidate "$tpck" "$TMP/tpwhole" >/dev/null 2>&1
"$CTRAIN" export-hf "$tpck" "$TMP/hf-sharded" >/dev/null 2>&1
"$CTRAIN" export-hf "$TMP/tpwhole" "$TMP/hf-whole" >/dev/null 2>&1
check "export-hf from the tp=2 checkpoint == from its consolidated copy" \
  cmp "$TMP/hf-sharded/model.safetensors" "$TMP/hf-whole/model.safetensors"
gen() { "$CTRAIN" generate --model "$1" --prompt 'The ' --max_new_tokens 12 --greedy 2>/dev/null; }
g1=$(gen "$tpck"); g2=$(gen "$TMP/tpwhole")
check "generate from the tp=2 checkpoint == from its consolidated copy (${#g1} characters)" \
  bash -c '[ -n "$1" ] && [ "$1" = "$2" ]' _ "$g1" "$g2"
cp -r "$TMP/r-tp2@2 -> tp1@1" "$TMP/nowshard"
rm -rf "$TMP/nowshard/ckpt/step_00000010" && ln -sfn step_00000005 "$TMP/nowshard/ckpt/latest"
rm "$TMP/nowshard/ckpt/step_00000005/model-rank00000.h5"
expect_fail 2 'model-rank00000\.h5 is missing: model\.h5 names 2 shard files' -- \
  "$CTRAIN" train "${args[@]}" train.resume=auto "train.out_dir=$TMP/nowshard"
resume "zero3@2 -> tp2@2 (accumulation 2)" "$TMP/gpt2-acc" 2 "parallel.data=zero3" 2 "parallel.tensor=2 train.grad_accum=2"
# the 4-rank mesh's moments are blocks cut by both the tp heads / halves and the ZeRO slices
resume "llama tp2 x zero3 dp2 @4 -> 1 process" "$TMP/llama-acc" 4 "${llama[*]} parallel.tensor=2 parallel.data=zero3" 1 "${llama[*]} train.grad_accum=2"
check "the mesh checkpoint has 4 moment shards" \
  bash -c "ls '$TMP/r-llama tp2 x zero3 dp2 @4 -> 1 process/ckpt/step_00000005/' | grep -c 'state-rank' | grep -qx 4"
check "tp=2 checkpoint generates text with ctrain generate" \
  bash -c "'$CTRAIN' generate --model '$TMP/r-tp1@1 -> tp2@2/ckpt/latest' --prompt 'The ' --max_new_tokens 8 >/dev/null 2>&1"

# layouts that cannot work
expect_fail 2 'parallel\.tensor = 8 must divide model\.n_head \(4\)' -- "$CTRAIN" train "${args[@]}" parallel.tensor=8
expect_fail 2 'parallel\.tensor = 2 must divide model\.n_head \(4\) and model\.n_kv_head \(1\)' -- \
  "$CTRAIN" train "${args[@]}" "${llama[@]}" model.n_kv_head=1 parallel.tensor=2
expect_fail 2 'parallel\.tensor = 2 does not divide the world size 1' -- "$CTRAIN" train "${args[@]}" parallel.tensor=2 "train.out_dir=$TMP/bad"
run 2 parallel.tensor=4 model.n_head=4 "train.out_dir=$TMP/bad2"
rc=$?
check "tensor 4 on 2 ranks fails (exit $rc) naming the key" \
  bash -c "[ $rc -ne 0 ] && grep -q 'parallel.tensor = 4 does not divide the world size 2' '$TMP/last.log'"
finish

#!/usr/bin/env bash
# Kernel choices on the CPU: the fused head + cross-entropy in chunks (kernels.head_chunk) trains
# the same losses, gradient norms and validation losses as the whole-batch head, alone and on 2
# DDP ranks, and shrinks the activation estimate; [kernels] entries and [attention] are applied
# and printed; the eval table is used for validation without changing training.
source "$(dirname "$0")/lib.sh"
CLOSE_MIN=12 # runs of 12 steps
SRC=${CT_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
LAUNCH=$(dirname "$CTRAIN")/ctrain-launch
make_data "$TMP/data" || exit 1
args=("$SRC/configs/smoke.toml" "data.train=$TMP/data/train.h5" "data.val=$TMP/data/val.h5"
      model.n_layer=2 model.d_model=64 model.max_seq_len=64 train.seq_len=64 train.micro_batch=8
      train.eval_every=4 train.eval_steps=2 train.sample_tokens=0 train.warmup_steps=2
      train.max_steps=12 train.threads=1)
"$CTRAIN" train "${args[@]}" "train.out_dir=$TMP/full" >"$TMP/full.log" 2>&1
"$CTRAIN" train "${args[@]}" kernels.head_chunk=100 "train.out_dir=$TMP/chunk" >"$TMP/chunk.log" 2>&1
check "head in chunks of 100 rows (512 per micro-batch) trains (exit $?)" test -f "$TMP/chunk/ckpt/latest/model.h5"
check "head chunks == whole head: losses" close "$TMP/full" "$TMP/chunk" loss 1e-6
check "head chunks == whole head: gradient norms" close "$TMP/full" "$TMP/chunk" grad_norm 1e-6
check "head chunks == whole head: validation losses" close "$TMP/full" "$TMP/chunk" val_loss 1e-6 3
"$LAUNCH" --nproc_per_node 2 --standalone "${args[@]}" train.micro_batch=4 kernels.head_chunk=64 \
  "train.out_dir=$TMP/ddp_chunk" >/dev/null 2>&1
check "2 DDP ranks with head chunks == 1 process: losses" close "$TMP/full" "$TMP/ddp_chunk" loss 1e-5
act() { "$CTRAIN" memory "$SRC/configs/qwen3-0.6b.toml" "$@" | awk '/activations/ { print $2 }'; }
full_act=$(act); chunk_act=$(act kernels.head_chunk=1024)
check "qwen3-0.6b: head chunks of 1024 rows shrink the activation estimate ($full_act -> $chunk_act MiB)" \
  awk -v a="$full_act" -v b="$chunk_act" 'BEGIN { exit !(b > 0 && a - b > 1000) }'
"$CTRAIN" train "${args[@]}" kernels.head_chunk=64 parallel.data=zero2 >"$TMP/z2.log" 2>&1
check "zero2 with head chunks exits 2" test $? -eq 2
check "zero2 with head chunks: the message names the key and the requirement" \
  grep -q 'kernels.head_chunk = 64 computes the head.s gradient during the forward: it needs parallel.data = ddp or zero1' "$TMP/z2.log"
"$CTRAIN" train "${args[@]}" kernels.cpu.eval.attention=eager attention.implementation=eager \
  "train.out_dir=$TMP/k" >"$TMP/k.log" 2>&1
check "[kernels] and [attention] entries run (exit $?) and the resolved table is printed" \
  grep -q '^  attention  eager      eager' "$TMP/k.log"
check "kernel entries leave training unchanged: losses bit-identical" \
  diff <(field "$TMP/full" loss) <(field "$TMP/k" loss)
finish

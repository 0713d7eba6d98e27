#!/usr/bin/env bash
# Data-parallel modes on 2 CPU ranks over Gloo against one process with the same global batch
# (gradient accumulation 2), for the tiny gpt2 and llama (GQA, qk_norm, untied head) models:
# ddp, zero1, zero2 (sharded gradients) and zero3 (sharded weights, gathered per layer) train
# the same losses and gradient norms (<= 1e-5 relative) over 10 steps and end with the same
# weights (<= 1e-5 absolute, every tensor of the checkpoint); validation losses match ddp's. A checkpoint saved in
# one layout resumes in another (zero3@2 -> ddp@1, ddp@1 -> zero3@2, zero2@2 -> zero1@2,
# zero3@2 -> ddp@2) and continues the uninterrupted run's losses; ZeRO checkpoints keep the
# moments in one shard file per rank (a missing shard is a clear error, a crash mid-save keeps
# the previous checkpoint). zero3 checkpoints gather no weights either: each rank writes its weight
# blocks to model-rank<R>.h5 and model.h5 holds none; they resume bit-identically in zero3@2,
# load in other layouts, generate and export-hf as a whole checkpoint does, and a missing weight
# shard is an error naming the file. ddp with small buckets reduces them during backward with the same
# losses. `ctrain memory` shows zero3 holding ~1/N of ddp's model state.
source "$(dirname "$0")/lib.sh"
SRC=${CT_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
LAUNCH=$(dirname "$CTRAIN")/ctrain-launch
make_data "$TMP/data" || exit 1
args=("$SRC/configs/smoke.toml" "data.train=$TMP/data/train.h5" "data.val=$TMP/data/val.h5"
      model.n_layer=2 model.d_model=64 model.max_seq_len=64 train.seq_len=64 train.micro_batch=4
      train.eval_every=5 train.eval_steps=2 train.sample_tokens=0 train.warmup_steps=2
      train.max_steps=10 train.threads=1)
llama=(model.arch=llama model.n_kv_head=2 model.qk_norm=true model.tie_embeddings=false)
# whole, same_weights: lib.sh
one() { "$CTRAIN" train "${args[@]}" "$@" >/dev/null 2>&1; }
two() { "$LAUNCH" --nproc_per_node 2 --standalone "${args[@]}" "$@" >"$TMP/last.log" 2>&1; }

for arch in gpt2 llama; do
  extra=()
  [ "$arch" = llama ] && extra=("${llama[@]}")
  one "${extra[@]}" train.grad_accum=2 "train.out_dir=$TMP/$arch-one"
  for mode in ddp zero1 zero2 zero3; do
    two "${extra[@]}" parallel.data=$mode "train.out_dir=$TMP/$arch-$mode"
    check "$arch $mode on 2 ranks trains (exit $?)" test -f "$TMP/$arch-$mode/ckpt/latest/state.h5"
    check "$arch $mode == 1 process: losses" close "$TMP/$arch-one" "$TMP/$arch-$mode" loss 1e-5
    check "$arch $mode == 1 process: gradient norms" close "$TMP/$arch-one" "$TMP/$arch-$mode" grad_norm 1e-5
    # 2 ranks evaluate twice the validation batches of 1 process: compare with ddp on 2 ranks
    [ $mode != ddp ] && check "$arch $mode == ddp on 2 ranks: validation losses" close "$TMP/$arch-ddp" "$TMP/$arch-$mode" val_loss 1e-5 2
    check "$arch $mode == 1 process: final weights" same_weights "$TMP/$arch-one" "$TMP/$arch-$mode" 1e-5
  done
done
# overlapped ddp: small buckets are all-reduced one by one as backward finishes their layers
two parallel.data=ddp parallel.bucket_mb=0.02 "train.out_dir=$TMP/buckets"
check "ddp with 20 KiB buckets issues several during backward" \
  grep -qE "all-reduced in ([3-9]|[1-9][0-9]+) buckets" "$TMP/last.log"
check "ddp with 20 KiB buckets == 1 process: losses" close "$TMP/gpt2-one" "$TMP/buckets" loss 1e-5
# accumulation inside zero2/3 (each backward's reduce-scatter adds to the shard), and zero3
# keeping the gathered layers from forward to backward
one train.grad_accum=4 "train.out_dir=$TMP/acc-one"
two train.grad_accum=2 parallel.data=zero2 "train.out_dir=$TMP/acc-zero2"
check "zero2 with accumulation 2 == 1 process x 4: losses" close "$TMP/acc-one" "$TMP/acc-zero2" loss 1e-5
two train.grad_accum=2 parallel.data=zero3 parallel.reshard_after_forward=false "train.out_dir=$TMP/acc-zero3"
check "zero3 (no reshard) with accumulation 2 == 1 process x 4: losses" close "$TMP/acc-one" "$TMP/acc-zero3" loss 1e-5
check "zero3 (no reshard) with accumulation 2 == 1 process x 4: final weights" same_weights "$TMP/acc-one" "$TMP/acc-zero3" 1e-5

# checkpoints across layouts: stop at step 5 in one layout, resume in another, compare with the
# uninterrupted single-process run
resume() { # resume NAME FROM_NPROC "FROM ARGS" TO_NPROC "TO ARGS"
  local dir=$TMP/r-$1
  if [ "$2" = 1 ]; then one $3 train.stop_after=5 "train.out_dir=$dir"; else two $3 train.stop_after=5 "train.out_dir=$dir"; fi
  if [ "$4" = 1 ]; then "$CTRAIN" train "${args[@]}" $5 train.resume=auto "train.out_dir=$dir" >"$TMP/last.log" 2>&1
  else two $5 train.resume=auto "train.out_dir=$dir"; fi
  check "$1: resumed at step 5" grep -q "resumed from .* at step 5" "$TMP/last.log"
  check "$1: continues the same losses" close "$TMP/gpt2-one" "$dir" loss 1e-5
  check "$1: same final weights" same_weights "$TMP/gpt2-one" "$dir" 1e-5
}
resume "zero3@2 -> ddp@1" 2 "parallel.data=zero3" 1 "train.grad_accum=2"
resume "ddp@1 -> zero3@2" 1 "train.grad_accum=2" 2 "parallel.data=zero3"
resume "zero2@2 -> zero1@2" 2 "parallel.data=zero2" 2 "parallel.data=zero1"
resume "zero3@2 -> ddp@2" 2 "parallel.data=zero3" 2 "parallel.data=ddp"
resume "zero3@2 -> zero3@2" 2 "parallel.data=zero3" 2 "parallel.data=zero3"
check "zero3@2 -> zero3@2: the same losses as the uninterrupted zero3@2 run, bit for bit" \
  close "$TMP/gpt2-zero3" "$TMP/r-zero3@2 -> zero3@2" loss 0
# memory accounting: zero3 keeps ~1/N of ddp's model state (plus the embedding and final units
# and two gathered layers); the log prints the estimate and the measured peak
state() { "$CTRAIN" memory "$SRC/configs/$1" --world "$2" "parallel.data=$3" | awk '/= model state/ { print $4 }'; }
ratio_below() { # ratio_below CONFIG WORLD MAX: zero3 / ddp model state
  local z d
  z=$(state "$1" "$2" zero3); d=$(state "$1" "$2" ddp)
  awk -v z="$z" -v d="$d" -v max="$3" 'BEGIN { printf "  zero3 %s MiB / ddp %s MiB = %.3f (want < %s)\n", z, d, z / d, max; exit !(d > 0 && z / d < max) }'
}
# The estimate is for the op table this build would use: with CUDA the gathered layers and the
# embedding/final units are bf16 working copies (gpt2 0.38, qwen3 0.22 of ddp's model state);
# a CPU-only build keeps them in fp32 (0.47 and 0.28).
table=$("$CTRAIN" memory "$SRC/configs/gpt2-124m.toml" --world 4 | sed -n 's/.*op table \([a-z0-9-]*\).*/\1/p')
if [ "$table" = cpu ]; then lim_g=0.48 lim_q=0.29; else lim_g=0.45 lim_q=0.25; fi
check "ctrain memory ($table): gpt2-124m zero3 on 4 ranks < $lim_g x ddp's model state" ratio_below gpt2-124m.toml 4 $lim_g
check "ctrain memory ($table): qwen3-0.6b zero3 on 8 ranks < $lim_q x ddp's model state" ratio_below qwen3-0.6b.toml 8 $lim_q
check "ctrain memory: zero2 between zero1 and zero3 (gpt2-124m, 4 ranks)" bash -c \
  "z1=\$('$CTRAIN' memory '$SRC/configs/gpt2-124m.toml' --world 4 parallel.data=zero1 | awk '/= model state/ {print \$4}');
   z2=\$('$CTRAIN' memory '$SRC/configs/gpt2-124m.toml' --world 4 parallel.data=zero2 | awk '/= model state/ {print \$4}');
   z3=\$('$CTRAIN' memory '$SRC/configs/gpt2-124m.toml' --world 4 parallel.data=zero3 | awk '/= model state/ {print \$4}');
   awk -v a=\$z1 -v b=\$z2 -v c=\$z3 'BEGIN { exit !(a > b && b > c) }'"
# parallel.ce_allreduce: the copy engines' receive area, (N - 1) / N of the gradient buffer in
# the wire dtype, is counted on a GPU table (cuda-bf16: 2 bytes a gradient on the bf16 wire, 4 on
# fp32); the CPU table's Gloo all-reduce has none
grads() { "$CTRAIN" memory "$SRC/configs/gpt2-124m.toml" --world "$1" "${@:2}" | awk '/gradients/ { print $3 }'; }
numel=$("$CTRAIN" memory "$SRC/configs/gpt2-124m.toml" --world 4 | sed -n 's/.*(\([0-9]*\) floats.*/\1/p')
ce_grows() { # ce_grows WORLD WIRE_BYTES [key=value...]: gradients grow by (WORLD-1)/WORLD * numel * WIRE_BYTES
  local g0 g1 w=$1 wb=$2; shift 2
  g0=$(grads "$w" "$@"); g1=$(grads "$w" "$@" parallel.ce_allreduce=true)
  [ "$table" = cpu ] && wb=0
  awk -v a="$g0" -v b="$g1" -v n="$numel" -v w="$w" -v wb="$wb" 'BEGIN {
    want = (w - 1) * int((n + w - 1) / w) * wb / 1048576; printf "  gradients %s -> %s MiB, +%.1f (want +%.1f)\n", a, b, b - a, want
    exit !(b - a > want - 0.2 && b - a < want + 0.2) }'
}
if [ "$table" = cpu ]; then ce_what="adds nothing on the CPU table"; else ce_what="counts its receive area"; fi
check "ctrain memory ($table): parallel.ce_allreduce $ce_what (4 ranks, bf16 wire)" \
  ce_grows 4 2 parallel.reduce_dtype=bf16
check "ctrain memory ($table): parallel.ce_allreduce $ce_what (2 ranks, fp32 wire)" \
  ce_grows 2 4 parallel.reduce_dtype=fp32
expect_fail 2 'parallel\.tensor = 2 does not divide the world size 3' -- "$CTRAIN" memory "$SRC/configs/gpt2-124m.toml" --world 3 parallel.tensor=2
two parallel.data=zero3 "train.out_dir=$TMP/mem"
check "training logs the estimate and the measured peak" \
  bash -c "grep -q 'memory per rank: 2 ranks' '$TMP/last.log' && grep -qE 'rank 1: estimated [0-9.]+ MiB per rank .* measured peak [0-9.]+ MiB' '$TMP/last.log'"
# sharded optimizer state and weights: each rank wrote its own moments and weight blocks, state.h5
# and model.h5 hold none (model.h5 says weight_shards = 2); zero2 keeps whole weights in model.h5
z3ck="$TMP/r-zero3@2 -> ddp@2/ckpt/step_00000005"
check "zero3 checkpoint: one moments shard per rank, none in state.h5" bash -c \
  "test -f '$z3ck/state-rank00000.h5' && test -f '$z3ck/state-rank00001.h5' && ! h5ls '$z3ck/state.h5' | grep -q adam_m"
check "zero3 checkpoint: no tensor in model.h5, weight_shards = 2, wte in blocks from both ranks" bash -c \
  "[ \$(h5ls -r '$z3ck/model.h5' | grep -c Dataset) -eq 0 ] && h5dump -a /weight_shards '$z3ck/model.h5' | grep -q '(0): 2' &&
   h5ls -r '$z3ck/model-rank00000.h5' | grep -q '^/w/wte/0 ' && h5ls -r '$z3ck/model-rank00001.h5' | grep -q '^/w/wte/0 '"
check "zero2 checkpoint: whole weights in model.h5, no weight shards" bash -c \
  "h5ls '$TMP/gpt2-zero2/ckpt/latest/model.h5' | grep -q 'wte  *Dataset {320, 64}' && ! ls '$TMP/gpt2-zero2/ckpt/latest/' | grep -q model-rank"
# readers of weights: generate and export-hf give what they give from the consolidated checkpoint
"$CTRAIN" consolidate "$z3ck" "$TMP/z3whole" >/dev/null 2>&1
check "consolidate wrote whole tensors" bash -c "h5ls '$TMP/z3whole/model.h5' | grep -q 'wte  *Dataset {320, 64}'"
gen() { "$CTRAIN" generate --model "$1" --prompt 'The ' --max_new_tokens 12 --greedy 2>/dev/null; }
g1=$(gen "$z3ck"); g2=$(gen "$TMP/z3whole")
check "generate from the zero3 checkpoint == from its consolidated copy (${#g1} characters)" \
  bash -c '[ -n "$1" ] && [ "$1" = "$2" ]' _ "$g1" "$g2"
"$CTRAIN" export-hf "$z3ck" "$TMP/hf-sharded" >/dev/null 2>&1
"$CTRAIN" export-hf "$TMP/z3whole" "$TMP/hf-whole" >/dev/null 2>&1
check "export-hf from the zero3 checkpoint == from its consolidated copy" \
  cmp "$TMP/hf-sharded/model.safetensors" "$TMP/hf-whole/model.safetensors"
one train.max_steps=2 "train.init_from=$z3ck" "train.out_dir=$TMP/init-sharded"
one train.max_steps=2 "train.init_from=$TMP/z3whole" "train.out_dir=$TMP/init-whole"
check "train.init_from the zero3 checkpoint == from its consolidated copy: losses, bit for bit" \
  close "$TMP/init-whole" "$TMP/init-sharded" loss 0 2
check "... and they start from the trained weights (first loss below a fresh model's)" \
  awk -v a="$(field "$TMP/init-sharded" loss | head -1)" -v b="$(field "$TMP/gpt2-one" loss | head -1)" \
  'BEGIN { printf "  first loss %s from the checkpoint, %s fresh\n", a, b; exit !(a > 0 && a < b - 0.1) }'
cp -r "$TMP/r-zero3@2 -> ddp@2" "$TMP/nowshard"
rm -rf "$TMP/nowshard/ckpt/step_00000010" && ln -sfn step_00000005 "$TMP/nowshard/ckpt/latest"
rm "$TMP/nowshard/ckpt/step_00000005/model-rank00001.h5"
expect_fail 2 'model-rank00001\.h5 is missing: model\.h5 names 2 shard files' -- \
  "$CTRAIN" train "${args[@]}" train.grad_accum=2 train.resume=auto "train.out_dir=$TMP/nowshard"
expect_fail 2 'model-rank00001\.h5 is missing' -- "$CTRAIN" generate --model "$TMP/nowshard/ckpt/latest" --max_new_tokens 2
cp -r "$TMP/r-zero3@2 -> ddp@2" "$TMP/missing"
rm -rf "$TMP/missing/ckpt/step_00000010" && ln -sfn step_00000005 "$TMP/missing/ckpt/latest"
rm "$TMP/missing/ckpt/step_00000005/state-rank00001.h5"
expect_fail 2 'state-rank00001\.h5 is missing: state\.h5 names 2 shard files \(state-rank\*\.h5\), 1 found' -- \
  "$CTRAIN" train "${args[@]}" train.grad_accum=2 train.resume=auto "train.out_dir=$TMP/missing"
cp -r "$TMP/r-zero3@2 -> ddp@2" "$TMP/corrupt"
rm -rf "$TMP/corrupt/ckpt/step_00000010" && ln -sfn step_00000005 "$TMP/corrupt/ckpt/latest"
shard="$TMP/corrupt/ckpt/step_00000005/state-rank00000.h5"
head -c 64 /dev/zero | tr '\0' '\132' | \
  dd of="$shard" bs=1 seek=$(($(stat -c %s "$shard") / 2)) conv=notrunc status=none
expect_fail 2 'state-rank00000\.h5: (block .* is corrupted \(Fletcher32|not a readable HDF5)' -- \
  "$CTRAIN" train "${args[@]}" train.grad_accum=2 train.resume=auto "train.out_dir=$TMP/corrupt"
# a crash while ranks write their shards leaves the previous checkpoint as latest
two parallel.data=zero3 train.stop_after=5 "train.out_dir=$TMP/crash"
CT_CKPT_ABORT_AFTER=3 two parallel.data=zero3 train.resume=auto "train.out_dir=$TMP/crash"
check "crash during a sharded save: latest is still step 5" \
  test "$(readlink "$TMP/crash/ckpt/latest")" = step_00000005
# metrics.jsonl is appended to: drop the crashed attempt's steps 6-10 so that the resumed run's
# steps 6-10 are the ones compared
awk -F'[:,]' '$2 + 0 <= 5' "$TMP/crash/metrics.jsonl" >"$TMP/crash.jsonl" && mv "$TMP/crash.jsonl" "$TMP/crash/metrics.jsonl"
two parallel.data=zero3 train.resume=auto "train.out_dir=$TMP/crash"
check "crash during a sharded save: resuming finishes with the uninterrupted losses" \
  close "$TMP/gpt2-one" "$TMP/crash" loss 1e-5
check "the checkpoint records its layout" bash -c "h5dump -a /parallel_data '$TMP/r-zero3@2 -> ddp@2/ckpt/step_00000005/state.h5' | grep -q zero3"
finish

#!/usr/bin/env bash
# ZeRO-1 (parallel.data = "zero1") on CPU ranks over Gloo: the optimizer state is sharded, yet
# 2 ranks train the same losses as ddp on 2 ranks; its checkpoints
# (moments in one shard file per rank, reassembled by tensor name on load) resume bit-exactly at
# the same world size and load under ddp and at another world size.
source "$(dirname "$0")/lib.sh"
CLOSE_MIN=12 # runs of 12 steps
SRC=${CT_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
LAUNCH=$(dirname "$CTRAIN")/ctrain-launch
make_data "$TMP/data" || exit 1
args=("$SRC/configs/smoke.toml" "data.train=$TMP/data/train.h5" "data.val=$TMP/data/val.h5"
      model.n_layer=2 model.d_model=64 model.max_seq_len=64 train.seq_len=64 train.micro_batch=4
      train.eval_every=5 train.eval_steps=2 train.sample_tokens=0 train.warmup_steps=2
      train.max_steps=12 train.threads=1)
launch() { "$LAUNCH" --nproc_per_node "$1" --standalone "${args[@]}" "${@:2}"; }

launch 2 parallel.data=ddp "train.out_dir=$TMP/ddp" >/dev/null 2>&1
launch 2 parallel.data=zero1 "train.out_dir=$TMP/zero" >"$TMP/zero.log" 2>&1
check "zero1 on 2 ranks trains (exit $?)" test -f "$TMP/zero/ckpt/latest/state.h5"
check "zero1 == ddp: losses" close "$TMP/ddp" "$TMP/zero" loss 1e-5
check "zero1 == ddp: gradient norms (global, from per-shard sums)" close "$TMP/ddp" "$TMP/zero" grad_norm 1e-5
check "zero1 == ddp: validation losses" close "$TMP/ddp" "$TMP/zero" val_loss 1e-5 3
# exact resume at the same world size
launch 2 parallel.data=zero1 train.stop_after=6 "train.out_dir=$TMP/zsplit" >/dev/null 2>&1
launch 2 parallel.data=zero1 train.resume=auto "train.out_dir=$TMP/zsplit" >"$TMP/zsplit.log" 2>&1
check "zero1 resumed at step 6" grep -q "resumed from .* at step 6" "$TMP/zsplit.log"
check "zero1: 12 straight == 6 + resume + 6, exact" diff <(losses "$TMP/zero") <(losses "$TMP/zsplit")
# the moments are reassembled whole on load: the checkpoint resumes under ddp at 2 ranks (same numbers) and at 3 ranks
launch 2 parallel.data=zero1 train.stop_after=6 "train.out_dir=$TMP/z2d" >/dev/null 2>&1
launch 2 parallel.data=ddp train.resume=auto "train.out_dir=$TMP/z2d" >/dev/null 2>&1
check "zero1 checkpoint resumed under ddp continues the same losses" close "$TMP/zero" "$TMP/z2d" loss 1e-5
launch 2 parallel.data=zero1 train.stop_after=6 "train.out_dir=$TMP/z3" >/dev/null 2>&1
launch 3 parallel.data=zero1 train.resume=auto "train.out_dir=$TMP/z3" >"$TMP/z3.log" 2>&1
check "a 2-rank zero1 checkpoint resumes on 3 ranks (resharded) and finishes" \
  bash -c "grep -q 'resumed from .* at step 6' '$TMP/z3.log' && test \"\$(readlink '$TMP/z3/ckpt/latest')\" = step_00000012"
finish

#!/usr/bin/env bash
# Checkpoints: exact resume (20 steps straight == 10 + resume + 10, losses compared as exact
# floats), a crash in the middle of a save leaves the previous checkpoint intact and loadable,
# and corrupted or truncated checkpoints are detected and named.
source "$(dirname "$0")/lib.sh"
SRC=${CT_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
make_data "$TMP/data" || exit 1
run() { # run OUT_DIR key=value...
  local out=$1
  shift
  "$CTRAIN" train "$SRC/configs/smoke.toml" "data.train=$TMP/data/train.h5" "data.val=$TMP/data/val.h5" \
    model.n_layer=2 model.d_model=64 train.seq_len=64 model.max_seq_len=64 train.micro_batch=4 \
    train.eval_every=5 train.eval_steps=2 train.sample_tokens=0 train.warmup_steps=3 \
    "train.out_dir=$out" "$@"
}
vals() { grep '"val_loss"' "$1/metrics.jsonl"; }

run "$TMP/straight" train.max_steps=20 >/dev/null 2>&1
run "$TMP/split" train.max_steps=20 train.stop_after=10 >/dev/null 2>&1
check "first half saved a checkpoint with training state" test -f "$TMP/split/ckpt/step_00000010/state.h5"
log=$(run "$TMP/split" train.max_steps=20 train.resume=auto 2>&1 >/dev/null)
check "second half resumed at step 10" grep -q "resumed from .* at step 10" <<<"$log"
check "20 steps straight == 10 + resume + 10 (step, loss, lr, grad_norm as exact floats)" \
  diff <(losses "$TMP/straight") <(losses "$TMP/split")
check "validation losses identical too" diff <(vals "$TMP/straight") <(vals "$TMP/split")
check "20 step lines in the resumed metrics" test "$(losses "$TMP/split" | wc -l)" -eq 20

# a crash while saving step 10: step 5 stays the latest, loadable, and resuming completes
run "$TMP/crash" train.max_steps=20 train.stop_after=5 >/dev/null 2>&1
CT_CKPT_ABORT_AFTER=7 run "$TMP/crash" train.max_steps=20 train.stop_after=5 train.resume=auto >/dev/null 2>&1
rc=$?
check "the process died mid-save (exit $rc)" test "$rc" -ne 0 -a "$rc" -ne 2
check "latest still points at step 5" test "$(readlink "$TMP/crash/ckpt/latest")" = step_00000005
check "no half-written step_00000010" test ! -e "$TMP/crash/ckpt/step_00000010"
check "the step-5 checkpoint still loads" "$CTRAIN" generate --model "$TMP/crash" --max_new_tokens 4 --prompt a
log=$(run "$TMP/crash" train.max_steps=20 train.resume=auto 2>&1 >/dev/null)
check "resume after the crash starts at step 5" grep -q "at step 5" <<<"$log"
# metrics.jsonl also holds the lines of steps 6..10 from the run that crashed (logged before
# the save): the same values, since they are the same computation
check "and continues the same loss curve" \
  diff <(losses "$TMP/straight") <(losses "$TMP/crash" | awk '!seen[$0]++')

# corruption: a flipped byte inside tensor data is named; a truncated file is refused
ck="$TMP/straight/ckpt/step_00000020/model.h5"
cp "$ck" "$TMP/good.h5"
size=$(stat -c %s "$ck")
printf '\xff\xfe' | dd of="$ck" bs=1 seek=$((size / 2)) conv=notrunc status=none
expect_fail 2 'model\.h5: tensor [a-z_.0-9]+ is corrupted \(Fletcher32 checksum mismatch' -- \
  "$CTRAIN" generate --model "$TMP/straight" --max_new_tokens 2
head -c $((size / 3)) "$TMP/good.h5" >"$ck"
expect_fail 2 'model\.h5: (not a readable HDF5 file|tensor .* corrupted)' -- \
  "$CTRAIN" generate --model "$TMP/straight" --max_new_tokens 2
expect_fail 2 "$TMP/none: no checkpoint found" -- run "$TMP/w" train.max_steps=1 "train.init_from=$TMP/none"
# init_from starts a new run from saved weights: its first loss is the saved model's loss
cp "$TMP/good.h5" "$ck"
run "$TMP/init" train.max_steps=1 "train.init_from=$TMP/straight" train.eval_every=0 >/dev/null 2>&1
check "init_from loads the weights (first loss below the fresh model's)" awk -v a="$(losses "$TMP/init" | sed -n '1s/.*"loss": \([0-9.e+-]*\),.*/\1/p')" \
  -v b="$(losses "$TMP/straight" | sed -n '1s/.*"loss": \([0-9.e+-]*\),.*/\1/p')" 'BEGIN{exit !(a < b - 1)}' 
finish

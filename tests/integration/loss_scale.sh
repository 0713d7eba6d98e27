#!/usr/bin/env bash
# Dynamic loss scaling (the fp16 path), exercised on the CPU with train.loss_scale = "dynamic":
# a power-of-two scale changes nothing (losses and norms identical to an unscaled run); a step
# with an overflowed gradient is skipped, logged, and halves the scale; the scale and its
# good-step count survive a checkpoint (resumed run == uninterrupted run, exact floats).
source "$(dirname "$0")/lib.sh"
SRC=${CT_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
make_data "$TMP/data" || exit 1
args=("$SRC/configs/smoke.toml" "data.train=$TMP/data/train.h5" data.val= model.n_layer=2
      model.d_model=64 model.max_seq_len=64 train.seq_len=64 train.micro_batch=4
      train.sample_tokens=0 train.max_steps=10 train.warmup_steps=2)
steps() { grep '"loss":' "$1/metrics.jsonl" | sed 's/, "tokens_per_s".*//'; }
"$CTRAIN" train "${args[@]}" "train.out_dir=$TMP/plain" >/dev/null 2>&1
"$CTRAIN" train "${args[@]}" train.loss_scale=dynamic "train.out_dir=$TMP/scaled" >/dev/null 2>&1
check "scale 2^16 changes nothing: losses, lr and norms identical" diff <(steps "$TMP/plain") <(steps "$TMP/scaled")
check "the scale is logged per step" grep -q '"loss_scale": 65536, "skipped": false' "$TMP/scaled/metrics.jsonl"

CT_TEST_POISON_STEP=3 "$CTRAIN" train "${args[@]}" train.loss_scale=dynamic \
  "train.out_dir=$TMP/poison" >/dev/null 2>"$TMP/poison.log"
check "the overflowed step is skipped and says so" \
  grep -q 'step 3: inf/nan gradients at loss scale 65536: step skipped, scale now 32768' "$TMP/poison.log"
check "metrics mark it skipped" grep -q '{"step": 3, "loss_scale": 65536, "skipped": true}' "$TMP/poison/metrics.jsonl"
check "the next step runs at the halved scale" grep -q '{"step": 4, "loss_scale": 32768, "skipped": false}' "$TMP/poison/metrics.jsonl"
check "steps before the overflow are unchanged" diff <(steps "$TMP/plain" | head -2) <(steps "$TMP/poison" | head -2)
check "skipping a step changes the trajectory after it" \
  test "$(steps "$TMP/plain" | sed -n 5p)" != "$(steps "$TMP/poison" | sed -n 5p)"
CT_TEST_POISON_STEP=3 "$CTRAIN" train "${args[@]}" train.loss_scale=dynamic train.stop_after=6 \
  "train.out_dir=$TMP/split" >/dev/null 2>&1
"$CTRAIN" train "${args[@]}" train.loss_scale=dynamic train.resume=auto \
  "train.out_dir=$TMP/split" >/dev/null 2>"$TMP/split.log"
check "resume continues at the saved scale" grep -q 'dynamic loss scaling: scale 32768' "$TMP/split.log"
check "poisoned run: 6 + resume + 4 == 10 straight (exact)" diff <(steps "$TMP/poison") <(steps "$TMP/split")
finish

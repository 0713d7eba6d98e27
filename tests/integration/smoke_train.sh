#!/usr/bin/env bash
# `make run`'s training: configs/smoke.toml on the fortunes corpus reaches the stated
# validation loss within the stated time on 2 cores, writes metrics and a checkpoint, and
# `ctrain generate` samples from that checkpoint.
source "$(dirname "$0")/lib.sh"
SRC=${CT_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
MAX_VAL_LOSS=${CT_SMOKE_MAX_VAL_LOSS:-2.7}   # nats/byte; an untrained model is ln(257) = 5.55
MAX_SECONDS=${CT_SMOKE_MAX_SECONDS:-300}

make_data "$TMP/data" || exit 1
start=$(date +%s)
out=$("$CTRAIN" train "$SRC/configs/smoke.toml" "data.train=$TMP/data/train.h5" \
      "data.val=$TMP/data/val.h5" "train.out_dir=$TMP/run" 2>"$TMP/train.log")
rc=$?
elapsed=$(( $(date +%s) - start ))
cat "$TMP/train.log" | tail -n 8
echo "$out"
check "train exits 0" test "$rc" -eq 0
val=$(sed -n 's/^final val_loss \([0-9.]*\)$/\1/p' <<<"$out")
echo "final val_loss ${val:-none} after ${elapsed}s (limits: < $MAX_VAL_LOSS, < ${MAX_SECONDS}s)"
check "val_loss reported" test -n "$val"
check "val_loss < $MAX_VAL_LOSS" awk -v v="${val:-99}" -v m="$MAX_VAL_LOSS" 'BEGIN{exit !(v < m)}'
check "trained within ${MAX_SECONDS}s" test "$elapsed" -le "$MAX_SECONDS"
m="$TMP/run/metrics.jsonl"
check "metrics.jsonl has 300 step lines" test "$(grep -c '"tokens_per_s"' "$m")" -eq 300
check "step lines carry step, loss, lr, grad_norm, tokens_per_s" \
  grep -q '^{"step": 1, "loss": [0-9.e+-]*, "lr": [0-9.e+-]*, "grad_norm": [0-9.e+-]*, "tokens_per_s": ' "$m"
check "eval lines every 100 steps" test "$(grep -c '"val_loss"' "$m")" -eq 3
first=$(sed -n '1s/.*"loss": \([0-9.e+-]*\),.*/\1/p' "$m")
check "loss fell from ${first} by more than 2 nats" awk -v a="$first" -v b="$val" 'BEGIN{exit !(a - b > 2)}'
check "sample printed" grep -q '^sample' <<<"$out"
check "checkpoint saved" test -f "$TMP/run/ckpt/step_00000300/model.h5"
check "latest points at step 300" test "$(readlink "$TMP/run/ckpt/latest")" = step_00000300
gen=$("$CTRAIN" generate --model "$TMP/run" --prompt "Q: " --max_new_tokens 40 --seed 7 2>/dev/null)
check "generate from the checkpoint prints the prompt and new text" \
  test "${gen:0:3}" = "Q: " -a "${#gen}" -gt 10
gen2=$("$CTRAIN" generate --model "$TMP/run/ckpt/latest" --prompt "Q: " --max_new_tokens 40 --seed 7 2>/dev/null)
check "generate is deterministic for a seed" test "$gen" = "$gen2"
finish

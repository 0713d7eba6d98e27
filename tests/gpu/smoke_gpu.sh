#!/usr/bin/env bash
# GPU suite: 200 steps of the smoke config on the GPU (bf16, and fp16 with dynamic loss scaling)
# reach the CPU run's validation loss within 2%; an injected fp16 overflow skips the step and
# halves the scale; CUDA_VISIBLE_DEVICES= runs on the CPU. Exits 77 without a CUDA device.
source "$(dirname "$0")/../integration/lib.sh"
SRC=${CT_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
if ! "$CTRAIN" env 2>/dev/null | grep -q '^  cuda:0'; then echo "no CUDA device: skipped"; exit 77; fi
if [ -d /usr/share/games/fortunes ]; then make_data "$TMP/data"
else "$CTRAIN" prepare --out-dir "$TMP/data" /usr/lib/python3*/*.py >/dev/null 2>&1; fi
args=("$SRC/configs/smoke.toml" "data.train=$TMP/data/train.h5" "data.val=$TMP/data/val.h5"
      train.max_steps=200 train.eval_every=0 train.sample_tokens=0)
val() { sed -n 's/^final val_loss \([0-9.]*\)$/\1/p' <<<"$1"; }
cpu=$(CUDA_VISIBLE_DEVICES= "$CTRAIN" train "${args[@]}" "train.out_dir=$TMP/cpu" 2>"$TMP/cpu.log")
check "CUDA_VISIBLE_DEVICES= trains on the CPU" grep -q 'device: cpu' "$TMP/cpu.log"
for p in bf16 fp16; do
  out=$("$CTRAIN" train "${args[@]}" "train.precision=$p" "train.out_dir=$TMP/$p" 2>"$TMP/$p.log")
  check "$p on cuda:0" grep -q "device: cuda:0.*$p mixed precision" "$TMP/$p.log"
  check "$p val_loss $(val "$out") within 2% of the CPU's $(val "$cpu")" \
    awk -v g="$(val "$out")" -v c="$(val "$cpu")" 'BEGIN{d = g - c; if (d < 0) d = -d; exit !(g > 0 && d <= 0.02 * c)}'
done
CT_TEST_POISON_STEP=5 "$CTRAIN" train "${args[@]}" train.precision=fp16 train.max_steps=10 \
  "train.out_dir=$TMP/poison" >/dev/null 2>"$TMP/poison.log"
check "fp16: an overflowed step is skipped and the scale halves" \
  grep -q 'step 5: inf/nan gradients at loss scale 65536: step skipped, scale now 32768' "$TMP/poison.log"
# the training step recorded as a CUDA graph gives the same losses, bit for bit, as running it
# op by op (gpt2 and llama, bf16; graphs start at the third micro-batch)
losses() { grep -o '"loss": [^,]*' "$1/metrics.jsonl" | tr '\n' ' '; }
for arch in gpt2 llama; do
  for gr in on off; do
    "$CTRAIN" train "${args[@]}" train.precision=bf16 train.max_steps=12 train.grad_accum=2 \
      "model.arch=$arch" "train.cuda_graphs=$gr" "train.out_dir=$TMP/graph_${arch}_$gr" >/dev/null 2>&1
  done
  check "$arch: CUDA-graph training losses equal the op-by-op losses exactly" \
    test -n "$(losses "$TMP/graph_${arch}_on")" -a "$(losses "$TMP/graph_${arch}_on")" = "$(losses "$TMP/graph_${arch}_off")"
done
finish

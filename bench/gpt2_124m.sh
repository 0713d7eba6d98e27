#!/usr/bin/env bash
# bench/gpt2_124m.sh — the single-GPU headline benchmark (issue #5): GPT-2 124M (12 layers,
# 12 heads, d=768, vocab 50304, T=1024), bf16, micro-batch 64, 5 warm-up + 30 timed steps.
# ctrain and, in the same run on the same GPU, PyTorch (HF GPT2LMHeadModel, bf16 autocast, SDPA,
# fused AdamW, clipping) eager and torch.compile. Prints ms/step, tokens/s, MFU
# (6N + 6*L*T*d FLOPs per token against PEAK_TFLOPS, default 989 = H100/H200 SXM dense bf16),
# peak memory, time to first step, and the ratio ctrain / torch.compile.
#   usage: bench/gpt2_124m.sh [BUILD_DIR]     env: B (64), WARMUP (5), STEPS (30), OUT, COMMIT,
#          TORCH (eager compile; empty to skip), CTRAIN_EXTRA (more key=value overrides)
# ctrain reads tokens from an HDF5 file (`ctrain prepare` of the Python standard library's
# sources with the byte tokenizer): the arithmetic does not depend on the ids, and the skewed
# byte distribution is the hard case for the embedding backward.
set -uo pipefail
BUILD=${1:-build}
B=${B:-64}; T=1024; WARMUP=${WARMUP:-5}; STEPS=${STEPS:-30}
PEAK=${PEAK_TFLOPS:-989}
TORCH=${TORCH-eager compile}
cd "$(dirname "$0")/.."
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)} # pass COMMIT on a copied tree
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '_')
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
out=$OUT/gpt2_124m_$(date +%F)_${gpu}_${commit}.txt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; kill $(jobs -p) 2>/dev/null' EXIT
if [ ! -f data/bench/train.h5 ]; then
  "$BUILD/ctrain" prepare --out-dir data/bench /usr/lib/python3*/*.py /usr/lib/python3*/*/*.py >/dev/null 2>&1 ||
    { echo "prepare failed" >&2; exit 1; }
fi
L=12; D=768; V=50304
# 6N + 6 L T d per token, N = parameters without position embeddings (tied head counted once)
flops_tok=$(python3 -c "N=$V*$D+$L*(12*$D*$D+13*$D)+2*$D; print(6*N+6*$L*$T*$D)")
{
  echo "# GPT-2 124M, bf16, B=$B T=$T, $WARMUP warm-up + $STEPS timed steps, $(date -u +%FT%TZ), commit $commit"
  echo "# gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)"
  echo "# MFU = tokens/s * $flops_tok FLOPs/token / $PEAK TFLOP/s"
} | tee "$out"
peak_watch() { # samples the GPU's used memory while a command runs (whole process, context included)
  local f=$1; echo 0 >"$f"
  while :; do
    m=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "${CUDA_VISIBLE_DEVICES:-0}" | head -1)
    [ "$m" -gt "$(cat "$f")" ] 2>/dev/null && echo "$m" >"$f"
    sleep 0.2
  done
}
shape="model.arch=gpt2 model.n_layer=$L model.d_model=$D model.n_head=$L model.d_ff=$((4*D)) model.vocab_size=$V model.max_seq_len=$T"
peak_watch "$tmp/peak" & W=$!
"$BUILD/ctrain" train configs/smoke.toml $shape data.train=data/bench/train.h5 data.val= \
  train.seq_len=$T train.micro_batch=$B train.grad_accum=1 train.max_steps=$((WARMUP + STEPS)) \
  train.eval_every=0 train.sample_tokens=0 train.checkpoint_every=0 train.precision=bf16 \
  train.out_dir="$tmp/run" ${CTRAIN_EXTRA:-} >"$tmp/ctrain.log" 2>&1
rc=$?
kill $W 2>/dev/null; wait $W 2>/dev/null
grep -E "device|memory|start-up|done|error" "$tmp/ctrain.log" | sed 's/^/  ctrain log: /' | tee -a "$out"
ours=0
if [ $rc = 0 ]; then
  ours=$(python3 - "$tmp" "$WARMUP" "$B" "$T" "$flops_tok" "$PEAK" "$(cat "$tmp/peak")" <<'PY'
import json, re, statistics, sys
tmp, warm, B, T, ft, peak, mem = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6]), float(sys.argv[7])
rows = [json.loads(l) for l in open(tmp + "/run/metrics.jsonl") if '"tokens_per_s"' in l]
startup = float(re.search(r"start-up ([0-9.]+) s", open(tmp + "/ctrain.log").read()).group(1))
ms = statistics.median(r["step_ms"] for r in rows[warm:])
tps = B * T / (ms / 1e3)
print(json.dumps({"impl": "ctrain", "step_ms_median": round(ms, 2), "tokens_per_s": round(tps),
                  "mfu": round(tps * ft / (peak * 1e12), 4), "peak_gib_nvidia_smi": round(mem / 1024, 2),
                  "first_step_s": round(startup + rows[0]["step_ms"] / 1e3, 2),
                  "loss_first_last": [round(rows[0]["loss"], 4), round(rows[-1]["loss"], 4)]}))
PY
)
  echo "ctrain:        $ours" | tee -a "$out"
  ours=$(python3 -c "import json,sys; print(json.loads(sys.argv[1])['tokens_per_s'])" "$ours")
else
  tail -5 "$tmp/ctrain.log" | tee -a "$out"
fi
for mode in $TORCH; do
  extra=(); [ "$mode" = compile ] && extra=(--compile)
  peak_watch "$tmp/peak" & W=$!
  line=$(python3 bench/ref/torch_train.py --arch gpt2 --n_layer $L --d_model $D --n_head $L \
    --vocab_size $V --seq_len $T --micro_batch "$B" --warmup "$WARMUP" --steps "$STEPS" \
    --precision bf16 --peak_tflops "$PEAK" "${extra[@]}" 2>"$tmp/torch.log")
  kill $W 2>/dev/null; wait $W 2>/dev/null
  if [ -z "$line" ]; then tail -3 "$tmp/torch.log" | tee -a "$out"; continue; fi
  tps=$(python3 -c "import json,sys; print(json.loads(sys.argv[1])['tokens_per_s'])" "$line")
  printf "pytorch %-7s %s  (nvidia-smi peak %s GiB)\n" "$mode" "$line" "$(python3 -c "print(round($(cat "$tmp/peak") / 1024, 2))")" | tee -a "$out"
  python3 -c "print('ratio ctrain / pytorch $mode = %.3f' % ($ours / $tps))" | tee -a "$out"
done

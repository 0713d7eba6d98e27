#!/usr/bin/env bash
# bench/qwen3_0p6b.sh — end-to-end training of the Qwen3-0.6B shape on one GPU (issue #7): 28
# layers, d=1024, 16 heads x 128, 8 kv heads, qk_norm, SwiGLU 3072, vocab 151,936, tied, T=2048,
# bf16. ctrain with use_kernels on and off (and with the fused head + cross-entropy in chunks),
# and in the same run PyTorch (Transformers Qwen3ForCausalLM, bf16 autocast, SDPA, fused AdamW,
# torch.compile). tokens/s, MFU and the ratios.
#   usage: bench/qwen3_0p6b.sh [BUILD_DIR]    env: B (8), STEPS (20), OUT, COMMIT, TORCH (1; 0 skips
#   the PyTorch runs, whose torch.compile alone takes about two minutes: ctrain's variants only)
set -uo pipefail
BUILD=${1:-build-gpu}
B=${B:-8}; T=2048; STEPS=${STEPS:-20}
cd "$(dirname "$0")/.."
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
OUT=${OUT:-bench/results}
mkdir -p "$OUT" data
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '_')
out=$OUT/qwen3_0p6b_$(date +%F)_${gpu}_${commit}.txt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[ -f data/bench/train.h5 ] || "$BUILD/ctrain" prepare --out-dir data/bench /usr/lib/python3*/*.py >/dev/null 2>&1
echo "# Qwen3-0.6B shape, bf16, B=$B T=$T, $STEPS steps (median after 5), commit $commit" | tee "$out"
run() { # NAME overrides...
  local name=$1; shift
  rm -rf "$tmp/r"
  "$BUILD/ctrain" train configs/qwen3-0.6b.toml data.train=data/bench/train.h5 data.val= data.tokenizer=byte \
    train.micro_batch=$B train.grad_accum=1 train.max_steps=$((STEPS + 5)) train.eval_every=0 \
    train.sample_tokens=0 train.checkpoint_every=0 train.precision=bf16 "train.out_dir=$tmp/r" "$@" \
    >"$tmp/log" 2>&1 || { echo "$name: failed: $(tail -1 "$tmp/log")" | tee -a "$out"; return; }
  python3 - "$tmp/r/metrics.jsonl" "$name" <<'PY' | tee -a "$out"
import json, statistics, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l][5:]
print("%-34s %10.0f tok/s" % (sys.argv[2], statistics.median(x["tokens_per_s"] for x in r)))
PY
}
run "ctrain use_kernels=true"
run "ctrain use_kernels=false" kernels.use_kernels=false
run "ctrain + head_chunk=4096" kernels.head_chunk=4096
# own Hopper attention instead of auto's per-shape pick (cuDNN's where it is faster)
nvidia-smi --query-gpu=compute_cap --format=csv,noheader | grep -q '^9' &&
  run "ctrain attention=flash3" kernels.cuda.train.attention=flash3
[ "${TORCH:-1}" = 0 ] || for c in "" --compile; do
  python3 bench/ref/torch_train.py --arch qwen3 --n_layer 28 --d_model 1024 --n_head 16 --n_kv_head 8 \
    --head_dim 128 --d_ff 3072 --vocab_size 151936 --seq_len $T --micro_batch $B --steps $STEPS \
    --warmup 5 --precision bf16 --tie --rope_theta 1e6 $c 2>"$tmp/t.err" | tee -a "$out" || tail -2 "$tmp/t.err"
done

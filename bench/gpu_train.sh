#!/usr/bin/env bash
# bench/gpu_train.sh — single-GPU training throughput: ctrain against PyTorch (HF Transformers)
# on the same GPU, same shapes, same run. Prints tokens/s, the ratios, and writes
# bench/results/gpu_train_<date>_<gpu>_<commit>.txt.
#   usage: bench/gpu_train.sh [BUILD_DIR]   (env: STEPS, B, T, MODES)
# The data is byte-level (data/fortunes from `make data`): the token ids don't change the
# arithmetic, so throughput is measured on the real 50,257-entry GPT-2 vocabulary shape.
set -uo pipefail
BUILD=${1:-build}
STEPS=${STEPS:-20}
B=${B:-16}
T=${T:-1024}
MODES=${MODES:-"fp32 tf32 bf16 bf16+compile"}
cd "$(dirname "$0")/.."
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '_')
mkdir -p bench/results
out=bench/results/gpu_train_$(date +%F)_${gpu}_${commit}.txt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
shape="model.n_layer=12 model.d_model=768 model.n_head=12 model.vocab_size=50257 model.max_seq_len=$T"
{
  echo "# GPU training throughput, GPT-2 124M shape, B=$B T=$T, $(date -u +%FT%TZ), commit $commit"
  echo "# gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)"
} | tee "$out"
ctrain_tps() { # extra overrides...
  rm -rf "$tmp/run"
  "$BUILD/ctrain" train configs/smoke.toml $shape "train.seq_len=$T" "train.micro_batch=$B" \
    "train.max_steps=$((STEPS + 3))" train.eval_every=0 train.sample_tokens=0 data.val= \
    "train.out_dir=$tmp/run" "$@" >"$tmp/ctrain.log" 2>&1 || { tail -5 "$tmp/ctrain.log" >&2; echo 0; return; }
  python3 -c "
import json,statistics
rows=[json.loads(l) for l in open('$tmp/run/metrics.jsonl') if 'tokens_per_s' in l][3:]
print(round(statistics.median(r['tokens_per_s'] for r in rows)))"
}
ours_fp32=$(ctrain_tps train.precision=fp32)
ours_tf32=$(CT_CUDA_TF32=1 ctrain_tps train.precision=fp32)
ours_bf16=$(ctrain_tps train.precision=bf16)
printf "%-28s %12s\n" "ctrain fp32" "$ours_fp32" | tee -a "$out"
printf "%-28s %12s\n" "ctrain fp32 (TF32 matmuls)" "$ours_tf32" | tee -a "$out"
printf "%-28s %12s\n" "ctrain bf16" "$ours_bf16" | tee -a "$out"
for mode in $MODES; do
  prec=${mode%%+*}
  extra=()
  [[ $mode == *+compile ]] && extra=(--compile)
  line=$(python3 bench/ref/torch_train.py --arch gpt2 --n_layer 12 --d_model 768 --n_head 12 \
           --vocab_size 50257 --seq_len "$T" --micro_batch "$B" --steps "$STEPS" \
           --precision "$prec" "${extra[@]}" 2>"$tmp/torch.log") || { tail -3 "$tmp/torch.log"; continue; }
  tps=$(python3 -c "import json,sys; print(round(json.loads(sys.argv[1])['tokens_per_s']))" "$line")
  ref=$ours_fp32
  [ "$prec" = tf32 ] && ref=$ours_tf32
  [ "$prec" = bf16 ] && ref=$ours_bf16
  ratio=$(python3 -c "print(f'{$ref/$tps:.2f}')")
  printf "%-28s %12s   ctrain/pytorch = %s   %s\n" "pytorch $mode" "$tps" "$ratio" "$line" | tee -a "$out"
done

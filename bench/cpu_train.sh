#!/usr/bin/env bash
# bench/cpu_train.sh — CPU training throughput, ctrain against PyTorch (HF Transformers, fp32,
# same thread count, same shapes), measured in the same run. Prints both and the ratio and
# appends the report to bench/results/cpu_train_<date>_<commit>.txt.
#
# usage: bench/cpu_train.sh [PATH/TO/ctrain]   (env: THREADS, STEPS)
# needs: data/fortunes (make data), python3 with torch + transformers (pip install torch transformers)
set -euo pipefail
CTRAIN=${1:-build/ctrain}
THREADS=${THREADS:-$(nproc)}
STEPS=${STEPS:-20}
cd "$(dirname "$0")/.."
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
mkdir -p bench/results
out=bench/results/cpu_train_$(date +%F)_${commit}.txt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cpu=$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)

# name | ctrain overrides | torch_cpu_ref.py arguments
configs=(
  "smoke (gpt2 L4 d128 T128 B16)|model.n_layer=4 model.d_model=128 model.n_head=4 train.seq_len=128 train.micro_batch=16|--arch gpt2 --n_layer 4 --d_model 128 --n_head 4 --seq_len 128 --micro_batch 16"
  "gpt2 L6 d384 T256 B8|model.n_layer=6 model.d_model=384 model.n_head=6 model.max_seq_len=256 train.seq_len=256 train.micro_batch=8|--arch gpt2 --n_layer 6 --d_model 384 --n_head 6 --seq_len 256 --micro_batch 8"
)

{
  echo "# CPU training throughput, $(date -u +%FT%TZ), commit $commit"
  echo "# cpu: $cpu, threads: $THREADS, timed steps: $STEPS (after warm-up)"
  printf "%-32s %14s %14s %8s\n" config "ctrain tok/s" "pytorch tok/s" ratio
} | tee "$out"
for entry in "${configs[@]}"; do
  IFS='|' read -r name over targs <<<"$entry"
  # ctrain: tokens_per_s of the timed steps (the first step is warm-up), from metrics.jsonl
  OMP_NUM_THREADS=$THREADS "$CTRAIN" train configs/smoke.toml $over "train.max_steps=$((STEPS + 2))" \
    train.eval_every=0 train.sample_tokens=0 "train.threads=$THREADS" "train.out_dir=$tmp/run" \
    data.val= >/dev/null 2>"$tmp/ctrain.log" || { cat "$tmp/ctrain.log"; exit 1; }
  ours=$(python3 -c "
import json,statistics
rows=[json.loads(l) for l in open('$tmp/run/metrics.jsonl') if 'tokens_per_s' in l][2:]
print(round(statistics.median(r['tokens_per_s'] for r in rows)))")
  rm -rf "$tmp/run"
  theirs=$(python3 bench/torch_cpu_ref.py $targs --vocab_size 257 --threads "$THREADS" \
             --steps "$STEPS" --warmup 2 2>/dev/null | python3 -c "import json,sys; print(round(json.load(sys.stdin)['tokens_per_s']))")
  ratio=$(python3 -c "print(f'{$ours/$theirs:.2f}')")
  printf "%-32s %14s %14s %8s\n" "$name" "$ours" "$theirs" "$ratio" | tee -a "$out"
done
echo "(median tokens/s over timed steps; ratio = ctrain / pytorch)" | tee -a "$out"

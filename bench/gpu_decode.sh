#!/usr/bin/env bash
# bench/gpu_decode.sh — decode throughput of `ctrain generate` against Transformers `generate`
# in the same run, on a Llama-style ~0.6B model with random weights (configs/qwen3-0.6b.toml:
# the Qwen3-0.6B shape), bf16: batch 1, 8 and 64, 128 random prompt tokens, 256 new tokens,
# greedy, no end-of-text. ctrain builds the random model from the config itself (`--model
# CONFIG.toml`), so no checkpoint is needed. Prints time to first token, decode tokens/s, the
# ratio to the best Transformers mode, and at batch 1 the fraction of the memory-bandwidth
# bound: (weight bytes + KV bytes read per token) / measured device-copy bandwidth.
# CFG=configs/gpt2-124m.toml runs the GPT-2 124M shape the same way (LayerNorm, GELU, learned
# positions: the decode path without the Llama fusions) against GPT2LMHeadModel; another
# llama-arch config (configs/llama3.2-1b.toml) its own shape against LlamaForCausalLM.
# Env: CTRAIN (default build-gpu/ctrain), CFG (configs/qwen3-0.6b.toml), OUT (bench/results),
# BATCHES ("1 8 64"), COMPILE_BATCHES ("1 8 64"), COMPILE_TIMEOUT (300 s).
set -u
CTRAIN=${CTRAIN:-build-gpu/ctrain}
CFG=${CFG:-configs/qwen3-0.6b.toml}
OUT=${OUT:-bench/results}
BATCHES=${BATCHES:-1 8 64}
HERE=$(cd "$(dirname "$0")" && pwd)
P=128 NEW=256
REF="--arch qwen3 --config $CFG" # torch_decode_ref.py builds the config's shape
grep -q '^arch *= *"gpt2"' "$CFG" && REF="--arch gpt2"
mkdir -p "$OUT"
LOG="$OUT/gpu_decode_raw.txt"
: >"$LOG"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$LOG"
# device-to-device copy bandwidth (bytes read + written), median of 20 copies of 2 GiB
python3 - <<'PY' | tee -a "$LOG"
import torch, statistics
n = 1 << 30
a = torch.empty(n, dtype=torch.uint16, device="cuda"); a.random_(0, 60000)
b = torch.empty_like(a)
ts = []
for i in range(25):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); b.copy_(a); e.record(); e.synchronize()
    if i >= 5: ts.append(s.elapsed_time(e) / 1e3)
print("copy_bw_GBps %.1f" % (2 * a.numel() * 2 / statistics.median(ts) / 1e9))
PY
# one process for every batch size (the random model is built once); CTRAIN_GRAPHS_OFF=1 adds
# a batch-1 run without CUDA graphs
# a first batch-1 run warms the process up (lazy kernel loading, cuBLAS heuristics); the summary
# keeps the last run of each batch size
"$CTRAIN" generate --model "$CFG" --prompt_ids $P --batch "1,$(echo $BATCHES | tr ' ' ,)" \
  --max_new_tokens $NEW --ignore_eos --greedy --precision bf16 --cuda_graphs auto \
  >/dev/null 2>"$OUT/ctrain_auto.log"
grep '^stats:' "$OUT/ctrain_auto.log" | sed 's/^stats:/ctrain graphs=auto/' | tee -a "$LOG"
grep -q '^stats:' "$OUT/ctrain_auto.log" || tail -3 "$OUT/ctrain_auto.log"
if [ "${CTRAIN_GRAPHS_OFF:-0}" = 1 ]; then
  "$CTRAIN" generate --model "$CFG" --prompt_ids $P --batch 1 --max_new_tokens $NEW --ignore_eos \
    --greedy --precision bf16 --cuda_graphs off >/dev/null 2>"$OUT/ctrain_off.log"
  grep '^stats:' "$OUT/ctrain_off.log" | sed 's/^stats:/ctrain graphs=off/' | tee -a "$LOG"
fi
# Transformers: eager at every batch size; static cache + torch.compile (its compile takes a
# minute or more per batch size) at COMPILE_BATCHES, each under its own time limit. TORCH_LOG=FILE
# reuses the JSON lines of an earlier run instead (say so when reporting).
if [ -n "${TORCH_LOG:-}" ]; then
  echo "transformers results from $TORCH_LOG (an earlier run)" | tee -a "$LOG"
  grep '^{' "$TORCH_LOG" | tee -a "$LOG"
else
  PYTHONUNBUFFERED=1 timeout 240 python3 "$HERE/torch_decode_ref.py" $REF --batch $BATCHES --prompt $P \
    --new $NEW --modes eager --reps 1 2>"$OUT/torch_eager.err" | tee -a "$LOG"
  PYTHONUNBUFFERED=1 timeout "${COMPILE_TIMEOUT:-300}" python3 "$HERE/torch_decode_ref.py" $REF \
    --batch ${COMPILE_BATCHES:-1 8 64} --prompt $P --new $NEW --modes static_compile --reps 1 \
    2>"$OUT/torch_compile.err" | tee -a "$LOG"
fi
python3 - "$LOG" "$CFG" <<'PY' | tee "$OUT/gpu_decode.txt"
import json, re, sys
log, cfg = open(sys.argv[1]).read().splitlines(), open(sys.argv[2]).read()
num = lambda k: float(re.search(r"^%s\s*=\s*([0-9.e+-]+)" % k, cfg, re.M).group(1))
if re.search(r'^arch\s*=\s*"gpt2"', cfg, re.M):  # biases, LayerNorm, learned positions, d_ff 4C
    L, C, H, V, T = (int(num(k)) for k in ("n_layer", "d_model", "n_head", "vocab_size", "max_seq_len"))
    KV, hd, F = H, C // H, 4 * C
    params = V * C + T * C + L * (4 * C * C + 4 * C + 2 * C * F + F + C + 4 * C) + 2 * C
    unread = T * C  # a step reads one row of the position table, not all of it
else:
    L, C, H, KV, hd, F, V = (int(num(k)) for k in
        ("n_layer", "d_model", "n_head", "n_kv_head", "head_dim", "d_ff", "vocab_size"))
    qkn = 2 * hd if re.search(r"^qk_norm\s*=\s*true", cfg, re.M) else 0
    tied = re.search(r"^tie_embeddings\s*=\s*true", cfg, re.M)
    params = (1 if tied else 2) * V * C + L * ((H + 2 * KV) * hd * C + H * hd * C + 3 * C * F + 2 * C + qkn) + C
    unread = 0 if tied else V * C  # an untied embedding table: a step reads one row of it
bw = next(float(l.split()[1]) for l in log if l.startswith("copy_bw_GBps"))
ct, tr = {}, {}
for l in log:
    if l.startswith("ctrain"):
        kv = dict(x.split("=", 1) for x in l.split()[1:] if "=" in x)
        if "decode_tok_s" in kv: ct[(int(kv["batch"]), kv["graphs"])] = kv
    elif l.startswith("{") and '"impl"' in l:
        r = json.loads(l)
        if "decode_tok_s" in r: tr[(r["batch"], r["mode"])] = r
P, NEW = 128, 256
print("model: %.1fM parameters (bf16 weights %.2f GB, tied head counted once); copy bandwidth"
      " %.0f GB/s (read + write)" % (params / 1e6, 2 * params / 1e9, bw))
print("%-6s %-26s %10s %12s" % ("batch", "implementation", "TTFT ms", "decode tok/s"))
for (b, g), r in sorted(ct.items()):
    print("%-6d %-26s %10.2f %12.1f" % (b, "ctrain graphs=" + g, float(r["ttft_ms"]), float(r["decode_tok_s"])))
for (b, m), r in sorted(tr.items()):
    print("%-6d %-26s %10.2f %12.1f" % (b, "transformers " + m, r["ttft_ms"], r["decode_tok_s"]))
for b in sorted({k[0] for k in ct}):
    if (b, "auto") not in ct: continue
    c = float(ct[(b, "auto")]["decode_tok_s"])
    best = max((r["decode_tok_s"], m) for (bb, m), r in tr.items() if bb == b) if any(bb == b for bb, _ in tr) else None
    if best:
        print("batch %d: ctrain %.1f tok/s = %.2fx Transformers %s (%.1f tok/s)" % (b, c, c / best[0], best[1], best[0]))
    for (bb, m), r in sorted(tr.items()):
        if bb == b: print("   vs %s: %.2fx" % (m, c / r["decode_tok_s"]))
if (1, "auto") in ct:
    step = 1.0 / float(ct[(1, "auto")]["decode_tok_s"])
    kv_bytes = 2 * L * KV * hd * 2 * (P + NEW / 2)   # K and V, bf16, mean context
    floor = (2 * (params - unread) + kv_bytes) / (bw * 1e9)
    print("batch 1: %.1f us per token; bandwidth bound %.1f us ((%.2f GB weights + %.1f MB KV) /"
          " %.0f GB/s) -> %.0f%% of the bound" % (step * 1e6, floor * 1e6, 2 * (params - unread) / 1e9,
          kv_bytes / 1e6, bw, 100 * floor / step))
PY

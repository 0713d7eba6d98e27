#!/usr/bin/env bash
# bench/attention.sh — attention forward and forward+backward TFLOP/s (issue #7): causal, bf16,
# T = 1k, 2k, 4k, 8k at 16k tokens per call, head dims 64 (16 heads) and 128 (16 heads, 8 kv);
# every ctrain variant (test_ops_cuda --perf on its "bench" cases; cudnn = cuDNN fused attention
# where the build has it, auto = the per-shape measured choice between flash2 and cudnn) and, in the same run,
# PyTorch SDPA with its flash and cuDNN backends (bench/ref/torch_attention.py). FLOPs counted
# the same way for both (forward 2*B*H*T*T*D, backward twice that); prints ctrain's best per
# shape against PyTorch's best.
#   usage: bench/attention.sh [BUILD_DIR]     env: OUT (bench/results), COMMIT, ATTN (the ctrain
#   variants to time, default batched,flash,flash2,flash2b,cudnn,auto; batched alone takes minutes;
#   flash3, flash3-fused, flash3-bwd2, flash3-bwd2o1..6 (backward form 2's kernel variants,
#   CT_FLASH3_BWD2_OPT=1..6; 4 and 6 are hd 64's own-keys dQ) and flash3-fwd2 (forward form 2, CT_FLASH3_FWD=2) in builds for sm_90,
#   e.g. ATTN=flash3,flash3-fwd2,cudnn or ATTN=flash3-bwd2,flash3-bwd2o1,flash3-bwd2o2,flash3-bwd2o3,cudnn)
set -uo pipefail
BUILD=${1:-build-gpu}
cd "$(dirname "$0")/.."
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '_')
out=$OUT/attention_$(date +%F)_${gpu}_${commit}.txt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$BUILD/tests/test_ops_cuda" --perf --dtype bf16 --op attention --attn "${ATTN:-batched,flash,flash2,flash2b,cudnn,auto}" \
  >"$tmp/ctrain.txt" 2>&1
python3 bench/ref/torch_attention.py >"$tmp/torch.jsonl" 2>"$tmp/torch.err" || tail -3 "$tmp/torch.err"
python3 - "$tmp/ctrain.txt" "$tmp/torch.jsonl" "$commit" <<'PY' | tee "$out"
import json, re, sys
ct, tj, commit = sys.argv[1], sys.argv[2], sys.argv[3]
rows = {}  # (B,T,H,KV,D) -> {impl: (fwd_us, fwd_bwd_us)}
for line in open(ct):
    m = re.match(r"\s+attention_(fwd|bwd)/(\S+)\s+bench B(\d+) T(\d+) H(\d+) KV(\d+) hd(\d+)\s+([0-9.]+) us", line)
    if not m:
        continue
    kind, impl, B, T, H, KV, D, us = m.groups()
    key = tuple(int(x) for x in (B, T, H, KV, D))
    rows.setdefault(key, {}).setdefault("ctrain-" + impl, {})[kind] = float(us)
for line in open(tj):
    r = json.loads(line)
    if "error" in r:
        continue
    key = (r["B"], r["T"], r["H"], r["KV"], r["D"])
    rows.setdefault(key, {})[r["impl"]] = {"fwd": r["fwd_us"], "fwdbwd": r["fwd_bwd_us"]}
print("# attention, causal, bf16, commit %s; TFLOP/s with forward 2*B*H*T^2*D, backward 2x that" % commit)
print("# %-26s %-16s %10s %10s %12s %10s" % ("shape", "impl", "fwd us", "fwd TF/s", "fwd+bwd us", "f+b TF/s"))
for key in sorted(rows, key=lambda k: (k[4], k[1])):
    B, T, H, KV, D = key
    fl = 2.0 * B * H * T * T * D
    best = {}
    for impl, t in sorted(rows[key].items()):
        f = t.get("fwd")
        fb = t.get("fwdbwd") or (f + t["bwd"] if f and t.get("bwd") else None)
        if not f or not fb:
            continue
        side = impl.split("-")[0]
        if side not in best or fb < best[side][1]:
            best[side] = (impl, fb)
        print("  B%-3d T%-5d H%d KV%-2d D%-4d %-16s %10.1f %10.1f %12.1f %10.1f" % (
            B, T, H, KV, D, impl, f, fl / f / 1e6, fb, 3 * fl / fb / 1e6))
    if "ctrain" in best and "torch" in best:
        print("  -> best ctrain %s vs best PyTorch %s: %.2fx (fwd+bwd time)" % (
            best["ctrain"][0], best["torch"][0], best["torch"][1] / best["ctrain"][1]))
PY

#!/bin/bash
# device call 137 (call 136 ran the same with a pad that could not be set; its one result:
# CT_DECODE_ATT_NEXT_PDL=0 1,262-1,280 against 1,340-1,360 tokens/s): attention's blocks alone on their multiprocessors (CT_DECODE_ATT_PAD=KB of unused
# shared memory a block) and the output projection launched after attention completes
# (CT_DECODE_ATT_NEXT_PDL=0), against the default, batch 1; the same ids checked
cd /work/main 2>/dev/null || cd "$(dirname "$0")/../../.."
tar -xJf .carry/pack.tar.xz
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64 CT_SOURCE_ROOT=$PWD CT_BUILD_ROOT=$PWD/build-gpu
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
R=$OUT; t0=$(date +%s)
ts() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
G="build-gpu/ctrain generate --prompt_ids 128 --max_new_tokens 256 --ignore_eos --greedy --precision bf16 --cuda_graphs auto"
ab() { # tag model batches env...
  local tag=$1 m=$2 b=$3; shift 3
  env X=1 "$@" timeout 60 $G --model configs/$m.toml --batch $b 2>$R/ab.err >/dev/null
  echo "$tag: $(grep '^stats' $R/ab.err | awk '{for(i=1;i<=NF;i++){if($i~/^batch=/)b=$i; if($i~/^decode_tok_s=/)t=$i}; print b, t}' | tr '\n' ' ')"
  grep -iE "error|fail" $R/ab.err | head -3
}
ids() { env X=1 "$@" timeout 60 $G --model configs/qwen3-0.6b.toml --batch 1 --max_new_tokens 48 --print_ids 2>/dev/null | md5sum | cut -c1-12; }
ts "ids: default $(ids) pad214 $(ids CT_DECODE_ATT_PAD=214) pad218 $(ids CT_DECODE_ATT_PAD=218)"
ts "A/B qwen3-0.6b batch 1"
for r in 1 2 3; do
  ab base$r qwen3-0.6b 1,1,1
  ab pad200_$r qwen3-0.6b 1,1,1 CT_DECODE_ATT_PAD=200
  ab pad214_$r qwen3-0.6b 1,1,1 CT_DECODE_ATT_PAD=214
  ab pad218_$r qwen3-0.6b 1,1,1 CT_DECODE_ATT_PAD=218
  ab pad120_$r qwen3-0.6b 1,1,1 CT_DECODE_ATT_PAD=120
  [ $(( $(date +%s) - t0 )) -lt 240 ] || break
done
ts "what the kernels cost now (CT_DECODE_NULL: the named kernels launched empty; values garbage)"
for e in CT_DECODE_NULL=attention_decode_rope_kernel CT_DECODE_NULL=gemv_kernel CT_DECODE_NULL=all; do
  ab "$e" qwen3-0.6b 1,1 $e
done
python3 - <<'PY'
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
ts done
rm -f $R/ab.err

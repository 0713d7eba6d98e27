#!/bin/bash
# device call 135: the split-k one-row GEMV (gemv_ks_kernel: each task's k range over 2 or 4 warps,
# opt-in CT_DECODE_KS_PLAIN / _SWIGLU / _RESID) against the default, batch 1; decode op tests first
cd /work/main 2>/dev/null || cd "$(dirname "$0")/../../.."
tar -xJf .carry/pack.tar.xz
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64 CT_SOURCE_ROOT=$PWD CT_BUILD_ROOT=$PWD/build-gpu
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
R=$OUT; t0=$(date +%s)
ts() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
ts "test_decode_cuda"; OMP_NUM_THREADS=4 timeout 150 build-gpu/tests/test_decode_cuda > $R/test_decode.txt 2>&1; echo rc $?
grep -iE "fail|mismatch|split-k" $R/test_decode.txt | head -20; tail -1 $R/test_decode.txt
G="build-gpu/ctrain generate --prompt_ids 128 --max_new_tokens 256 --ignore_eos --greedy --precision bf16 --cuda_graphs auto"
ab() { # tag model batches env...
  local tag=$1 m=$2 b=$3; shift 3
  env X=1 "$@" timeout 60 $G --model configs/$m.toml --batch $b 2>$R/ab.err >/dev/null
  echo "$tag: $(grep '^stats' $R/ab.err | awk '{for(i=1;i<=NF;i++){if($i~/^batch=/)b=$i; if($i~/^decode_tok_s=/)t=$i}; print b, t}' | tr '\n' ' ')"
}
ts "A/B qwen3-0.6b batch 1"
for r in 1 2 3; do
  ab base$r qwen3-0.6b 1,1,1
  ab sw2_$r qwen3-0.6b 1,1,1 CT_DECODE_KS_SWIGLU=2
  ab resid2_$r qwen3-0.6b 1,1,1 CT_DECODE_KS_RESID=2
  ab plain2_$r qwen3-0.6b 1,1,1 CT_DECODE_KS_PLAIN=2
  ab all2_$r qwen3-0.6b 1,1,1 CT_DECODE_KS_SWIGLU=2 CT_DECODE_KS_RESID=2 CT_DECODE_KS_PLAIN=2
  ab resid4_$r qwen3-0.6b 1,1,1 CT_DECODE_KS_RESID=4
  [ $(( $(date +%s) - t0 )) -lt 200 ] || break
done
ts done
rm -f $R/ab.err

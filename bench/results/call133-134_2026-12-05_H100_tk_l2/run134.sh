#!/bin/bash
# device call 134: gate/up with 4 tasks a warp (96 blocks: fewer than the multiprocessors without
# an attention block) against the default and 2 / 3; decode op tests first
cd /work/main 2>/dev/null || cd "$(dirname "$0")/../../.."
tar -xJf .carry/pack.tar.xz
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64 CT_SOURCE_ROOT=$PWD CT_BUILD_ROOT=$PWD/build-gpu
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
R=$OUT; t0=$(date +%s)
ts() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
ts "test_decode_cuda"; OMP_NUM_THREADS=4 timeout 150 build-gpu/tests/test_decode_cuda > $R/test_decode.txt 2>&1; echo rc $?
grep -iE "fail|mismatch|tasks a warp" $R/test_decode.txt | head -20; tail -1 $R/test_decode.txt
G="build-gpu/ctrain generate --prompt_ids 128 --max_new_tokens 256 --ignore_eos --greedy --precision bf16 --cuda_graphs auto"
ab() { # tag model batches env...
  local tag=$1 m=$2 b=$3; shift 3
  env X=1 "$@" timeout 60 $G --model configs/$m.toml --batch $b 2>$R/ab.err >/dev/null
  echo "$tag: $(grep '^stats' $R/ab.err | awk '{for(i=1;i<=NF;i++){if($i~/^batch=/)b=$i; if($i~/^decode_tok_s=/)t=$i}; print b, t}' | tr '\n' ' ') $(grep -m1 'model loaded' $R/ab.err)"
}
ts "A/B qwen3-0.6b batch 1"
for r in 1 2 3; do
  ab base$r qwen3-0.6b 1,1,1
  ab sw4_$r qwen3-0.6b 1,1,1 CT_DECODE_TK_SWIGLU=4
  ab sw2_$r qwen3-0.6b 1,1,1 CT_DECODE_TK_SWIGLU=2
  [ $(( $(date +%s) - t0 )) -lt 400 ] || break
done
ts done
rm -f $R/ab.err

#!/bin/bash
# device call 138: attention's blocks alone on their multiprocessors as the default
# (CT_DECODE_ATT_ALONE=2) against 0 (off) and 1, batch 1-8 on three shapes; the decode op tests
# and the generate suite first
cd /work/main 2>/dev/null || cd "$(dirname "$0")/../../.."
tar -xJf .carry/pack.tar.xz
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64 CT_SOURCE_ROOT=$PWD CT_BUILD_ROOT=$PWD/build-gpu
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
R=$OUT; t0=$(date +%s)
ts() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
ts "test_decode_cuda"; OMP_NUM_THREADS=4 timeout 150 build-gpu/tests/test_decode_cuda > $R/test_decode.txt 2>&1; echo rc $?
grep -iE "fail|mismatch|alone" $R/test_decode.txt | head -20; tail -1 $R/test_decode.txt
ts "generate_gpu.sh"; timeout 150 bash tests/gpu/generate_gpu.sh build-gpu/ctrain > $R/generate_gpu.txt 2>&1; echo rc $?
grep -vE "^ok" $R/generate_gpu.txt | tail -5
G="build-gpu/ctrain generate --prompt_ids 128 --max_new_tokens 256 --ignore_eos --greedy --precision bf16 --cuda_graphs auto"
ab() { # tag model batches env...
  local tag=$1 m=$2 b=$3; shift 3
  env X=1 "$@" timeout 60 $G --model configs/$m.toml --batch $b 2>$R/ab.err >/dev/null
  echo "$tag: $(grep '^stats' $R/ab.err | awk '{for(i=1;i<=NF;i++){if($i~/^batch=/)b=$i; if($i~/^decode_tok_s=/)t=$i}; print b, t}' | tr '\n' ' ')"
  grep -iE "error|fail" $R/ab.err | head -3
}
ids() { env X=1 "$@" timeout 60 $G --model configs/$1.toml --batch 1,8 --max_new_tokens 48 --print_ids 2>/dev/null | md5sum | cut -c1-12; }
for m in qwen3-0.6b gpt2-124m llama3.2-1b; do
  ts "ids $m: default $(ids $m) off $(ids $m CT_DECODE_ATT_ALONE=0)"
done
ts "A/B"
for r in 1 2; do
  for m in qwen3-0.6b gpt2-124m llama3.2-1b; do
    ab "def_${m}_$r" $m 1,1,2,4,8
    ab "off_${m}_$r" $m 1,1,2,4,8 CT_DECODE_ATT_ALONE=0
    [ $m = qwen3-0.6b ] && ab "one_${m}_$r" $m 1,1,2,4,8 CT_DECODE_ATT_ALONE=1
    [ $m = qwen3-0.6b ] && ab "three_${m}_$r" $m 1,1,2,4,8 CT_DECODE_ATT_ALONE=3
  done
  [ $(( $(date +%s) - t0 )) -lt 420 ] || break
done
ts done
rm -f $R/ab.err

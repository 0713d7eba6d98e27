#!/bin/bash
# device call 143: attention and the GEMVs after it kept apart by shared-memory pads on both sides
# (CT_DECODE_ATT_APART=K with CT_DECODE_ATT_ALONE=0: attention's blocks may start beside the qkv
# GEMV's, the next K GEMV launches cannot sit beside attention), and attention triggering its
# dependents after its wait (CT_DECODE_ATT_LATE=1), against the landed rule (attention alone);
# same ids; then, on an H200 only, bench/gpu_decode.sh for the issue's figure
cd /work/main 2>/dev/null || cd "$(dirname "$0")/../../.."
tar -xJf .carry/pack.tar.xz
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64 CT_SOURCE_ROOT=$PWD CT_BUILD_ROOT=$PWD/build-gpu
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
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
ids() { local m=$1; shift; env X=1 "$@" timeout 60 $G --model configs/$m.toml --batch 1,8 --max_new_tokens 48 --print_ids 2>/dev/null | md5sum | cut -c1-12; }
ts "ids qwen3: def $(ids qwen3-0.6b) off $(ids qwen3-0.6b CT_DECODE_ATT_ALONE=0) apart2 $(ids qwen3-0.6b CT_DECODE_ATT_ALONE=0 CT_DECODE_ATT_APART=2) apart2late $(ids qwen3-0.6b CT_DECODE_ATT_ALONE=0 CT_DECODE_ATT_APART=2 CT_DECODE_ATT_LATE=1)"
for r in 1 2 3; do
  ab def_$r qwen3-0.6b 1,1
  ab off_$r qwen3-0.6b 1,1 CT_DECODE_ATT_ALONE=0
  ab apart1_$r qwen3-0.6b 1,1 CT_DECODE_ATT_ALONE=0 CT_DECODE_ATT_APART=1
  ab apart2_$r qwen3-0.6b 1,1 CT_DECODE_ATT_ALONE=0 CT_DECODE_ATT_APART=2
  ab apart2late_$r qwen3-0.6b 1,1 CT_DECODE_ATT_ALONE=0 CT_DECODE_ATT_APART=2 CT_DECODE_ATT_LATE=1
  ab deflate_$r qwen3-0.6b 1,1 CT_DECODE_ATT_LATE=1
done
for r in 1 2; do
  ab def_llama1b_$r llama3.2-1b 1,1
  ab apart2_llama1b_$r llama3.2-1b 1,1 CT_DECODE_ATT_ALONE=0 CT_DECODE_ATT_APART=2
  ab apart2late_llama1b_$r llama3.2-1b 1,1 CT_DECODE_ATT_ALONE=0 CT_DECODE_ATT_APART=2 CT_DECODE_ATT_LATE=1
done
if [[ $gpu == *H200* ]]; then
  ts "bench/gpu_decode.sh (H200)"
  mkdir -p $R/gd
  CTRAIN=build-gpu/ctrain OUT=$R/gd COMPILE_BATCHES=1 timeout 330 bash bench/gpu_decode.sh > $R/gd_stdout.txt 2>&1; echo rc $?
  cat $R/gd/gpu_decode.txt
fi
ts done
rm -f $R/ab.err

#!/bin/bash
# device call 140: with attention alone on its multiprocessors, 8 warps an attention block
# (ctrain-w8: a -DDEC_WARPS=8 build; clusters of 3 blocks, 24 multiprocessors at batch 1 instead
# of 48) against the default 4; batch 1, three shapes, interleaved rounds; the same ids
cd /work/main 2>/dev/null || cd "$(dirname "$0")/../../.."
tar -xJf .carry/pack.tar.xz
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64 CT_SOURCE_ROOT=$PWD CT_BUILD_ROOT=$PWD/build-gpu
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
R=$OUT; t0=$(date +%s)
ts() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
ab() { # tag binary model batches env...
  local tag=$1 bin=$2 m=$3 b=$4; shift 4
  env X=1 "$@" timeout 60 build-gpu/$bin generate --prompt_ids 128 --max_new_tokens 256 --ignore_eos --greedy \
    --precision bf16 --cuda_graphs auto --model configs/$m.toml --batch $b 2>$R/ab.err >/dev/null
  echo "$tag: $(grep '^stats' $R/ab.err | awk '{for(i=1;i<=NF;i++){if($i~/^batch=/)b=$i; if($i~/^decode_tok_s=/)t=$i}; print b, t}' | tr '\n' ' ')"
  grep -iE "error|fail" $R/ab.err | head -3
}
ids() { build-gpu/$1 generate --prompt_ids 128 --max_new_tokens 48 --ignore_eos --greedy --precision bf16 \
  --model configs/$2.toml --batch 1,8 --print_ids 2>/dev/null | md5sum | cut -c1-12; }
for m in qwen3-0.6b llama3.2-1b; do ts "ids $m: w4 $(ids ctrain $m) w8 $(ids ctrain-w8 $m)"; done
for r in 1 2 3; do
  ab w4_qwen3_$r ctrain qwen3-0.6b 1,1,1
  ab w8_qwen3_$r ctrain-w8 qwen3-0.6b 1,1,1
  ab w4_llama_$r ctrain llama3.2-1b 1,1
  ab w8_llama_$r ctrain-w8 llama3.2-1b 1,1
  ab w4_gpt2_$r ctrain gpt2-124m 1,1,8
  ab w8_gpt2_$r ctrain-w8 gpt2-124m 1,1,8
  [ $(( $(date +%s) - t0 )) -lt 200 ] || break
done
ts done
rm -f $R/ab.err

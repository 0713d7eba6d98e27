#!/bin/bash
# device call 147: (1) the decode timeline (ctrain-tl: decode.cu built with CT_DECODE_TIMELINE) with
# attention apart from the next two GEMVs (the default), alone (CT_DECODE_ATT_ALONE=50) and with no
# pad (CT_DECODE_ATT_APART=0): each kernel's release-to-release time and attention's phases,
# Qwen3-0.6B shape, batch 1; (2) attention with 8 warps a block (ctrain-w8: DEC_WARPS=8, so half
# the attention blocks and multiprocessors) against the default, the same ids
cd /work/main 2>/dev/null || cd "$(dirname "$0")/../../.."
tar -xJf .carry/pack.tar.xz
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64 CT_SOURCE_ROOT=$PWD CT_BUILD_ROOT=$PWD/build-gpu
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T="build-gpu/ctrain-tl generate --model configs/qwen3-0.6b.toml --prompt_ids 128 --max_new_tokens 256 --ignore_eos --greedy --precision bf16 --cuda_graphs auto --batch 1"
for e in X=1 CT_DECODE_ATT_ALONE=50 CT_DECODE_ATT_APART=0; do
  f=$OUT/timeline_${e%%=*}.txt
  env $e timeout 60 $T 2>&1 >/dev/null | grep -E "^stats|decode timeline|^  " > $f
  echo "== $e"; grep -E "^stats" $f | grep -oE "decode_tok_s=[0-9.]+"
  sed -n '3,14p' $f; tail -3 $f
done
G="--prompt_ids 128 --max_new_tokens 256 --ignore_eos --greedy --precision bf16 --cuda_graphs auto"
ab() { # tag binary model batches env...
  local tag=$1 bin=$2 m=$3 b=$4; shift 4
  env X=1 "$@" timeout 60 build-gpu/$bin generate $G --model configs/$m.toml --batch $b 2>$OUT/ab.err >/dev/null
  echo "$tag: $(grep '^stats' $OUT/ab.err | awk '{for(i=1;i<=NF;i++){if($i~/^batch=/)b=$i; if($i~/^decode_tok_s=/)t=$i}; print b, t}' | tr '\n' ' ')"
  grep -iE "error|fail" $OUT/ab.err | head -3
}
ids() { local bin=$1 m=$2; env X=1 timeout 60 build-gpu/$bin generate $G --model configs/$m.toml --batch 1,8 --max_new_tokens 48 --print_ids 2>/dev/null | md5sum | cut -c1-12; }
echo "ids qwen3: def $(ids ctrain qwen3-0.6b) w8 $(ids ctrain-w8 qwen3-0.6b)"
for r in 1 2; do
  ab def_$r ctrain qwen3-0.6b 1,1,8
  ab w8_$r ctrain-w8 qwen3-0.6b 1,1,8
  ab def_llama_$r ctrain llama3.2-1b 1,1
  ab w8_llama_$r ctrain-w8 llama3.2-1b 1,1
done
rm -f $OUT/ab.err

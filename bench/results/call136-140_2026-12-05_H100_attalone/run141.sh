#!/bin/bash
# device call 141: the decode timeline (ctrain-tl: decode.cu built with CT_DECODE_TIMELINE) with
# attention alone on its multiprocessors (the default) and without (CT_DECODE_ATT_ALONE=0): each
# kernel's release-to-release time and attention's phases, Qwen3-0.6B shape, batch 1
cd /work/main 2>/dev/null || cd "$(dirname "$0")/../../.."
tar -xJf .carry/pack.tar.xz
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64 CT_SOURCE_ROOT=$PWD CT_BUILD_ROOT=$PWD/build-gpu
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
G="build-gpu/ctrain-tl generate --model configs/qwen3-0.6b.toml --prompt_ids 128 --max_new_tokens 256 --ignore_eos --greedy --precision bf16 --cuda_graphs auto --batch 1"
for e in X=1 CT_DECODE_ATT_ALONE=0; do
  env $e timeout 60 $G 2>&1 >/dev/null | grep -E "^stats|decode timeline|^  " > $OUT/timeline_${e%%=*}.txt
  echo "== $e"; grep -E "^stats" $OUT/timeline_${e%%=*}.txt | grep -oE "decode_tok_s=[0-9.]+"
  sed -n '3,14p' $OUT/timeline_${e%%=*}.txt; tail -3 $OUT/timeline_${e%%=*}.txt
done

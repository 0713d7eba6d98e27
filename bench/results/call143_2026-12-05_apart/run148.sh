#!/bin/bash
# device call 148: the decode timeline of the default (attention apart from the next two GEMVs,
# triggering its dependents after its wait; call 147's timeline build noted no start for it),
# and apart with the early trigger (CT_DECODE_ATT_LATE=0), Qwen3-0.6B shape, batch 1
cd /work/main 2>/dev/null || cd "$(dirname "$0")/../../.."
tar -xJf .carry/pack.tar.xz
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64 CT_SOURCE_ROOT=$PWD CT_BUILD_ROOT=$PWD/build-gpu
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T="build-gpu/ctrain-tl generate --model configs/qwen3-0.6b.toml --prompt_ids 128 --max_new_tokens 256 --ignore_eos --greedy --precision bf16 --cuda_graphs auto --batch 1"
for e in X=1 CT_DECODE_ATT_LATE=0; do
  f=$OUT/timeline_${e%%=*}.txt
  env $e timeout 60 $T > /dev/null 2> $OUT/tl.err; grep -E "^stats|decode timeline|^  " $OUT/tl.err > $f
  echo "== $e"; grep -E "^stats" $f | grep -oE "decode_tok_s=[0-9.]+"; tail -3 $OUT/tl.err | grep -v "^  "
  sed -n '3,14p' $f; tail -3 $f
done
rm -f $OUT/tl.err

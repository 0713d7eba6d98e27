#!/bin/bash
# device call 133: the decode op tests (with the new tasks-a-warp / L2-window test), then batch-1
# decode tokens/s of the variants in one binary, interleaved (env switches, default off):
# CT_DECODE_TK_SWIGLU=2/3, CT_DECODE_TK_QKV=2, CT_DECODE_L2_HEAD=max; and the ids of each variant
# against the default's
cd /work/main 2>/dev/null || cd "$(dirname "$0")/../../.."
tar -xJf .carry/pack.tar.xz
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64 CT_SOURCE_ROOT=$PWD CT_BUILD_ROOT=$PWD/build-gpu OMP_NUM_THREADS=2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
R=$OUT; t0=$(date +%s)
ts() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
ts "test_decode_cuda"; timeout 200 build-gpu/tests/test_decode_cuda > $R/test_decode.txt 2>&1; echo rc $?
grep -iE "fail|mismatch|tasks a warp|persisting" $R/test_decode.txt | head -20; tail -1 $R/test_decode.txt
G="build-gpu/ctrain generate --prompt_ids 128 --max_new_tokens 256 --ignore_eos --greedy --precision bf16 --cuda_graphs auto"
ab() { # tag model batches env...
  local tag=$1 m=$2 b=$3; shift 3
  env X=1 "$@" timeout 60 $G --model configs/$m.toml --batch $b 2>$R/ab_$tag.err >/dev/null
  grep '^stats' $R/ab_$tag.err > $R/ab_$tag.txt
  echo "$tag: $(awk '{for(i=1;i<=NF;i++){if($i~/^batch=/)b=$i; if($i~/^decode_tok_s=/)t=$i}; print b, t}' $R/ab_$tag.txt | tr '\n' ' ')"
}
ts "A/B qwen3-0.6b batch 1"
for r in 1 2 3; do
  ab base$r qwen3-0.6b 1,1,1
  ab sw3_$r qwen3-0.6b 1,1,1 CT_DECODE_TK_SWIGLU=3
  ab sw3qkv2_$r qwen3-0.6b 1,1,1 CT_DECODE_TK_SWIGLU=3 CT_DECODE_TK_QKV=2
  ab qkv2_$r qwen3-0.6b 1,1,1 CT_DECODE_TK_QKV=2
  ab sw2_$r qwen3-0.6b 1,1,1 CT_DECODE_TK_SWIGLU=2
  ab l2_$r qwen3-0.6b 1,1,1 CT_DECODE_L2_HEAD=max CT_DECODE_L2_LOG=1
done
grep -h "set-aside" $R/ab_l2_1.err | head -2
ts "A/B gpt2-124m and llama3.2-1b batch 1"
for r in 1 2; do
  ab g_base$r gpt2-124m 1,1,1; ab g_qkv2_$r gpt2-124m 1,1,1 CT_DECODE_TK_QKV=2; ab g_l2_$r gpt2-124m 1,1,1 CT_DECODE_L2_HEAD=max
  ab l_base$r llama3.2-1b 1,1; ab l_l2_$r llama3.2-1b 1,1 CT_DECODE_L2_HEAD=max
done
ts "ids"
I="build-gpu/ctrain generate --prompt_ids 16 --batch 1,5,12 --max_new_tokens 48 --print_ids --greedy --precision bf16 --cuda_graphs auto"
for m in qwen3-0.6b gpt2-124m; do
  timeout 60 $I --model configs/$m.toml > $R/ids_base_$m.txt 2>/dev/null
  CT_DECODE_TK_SWIGLU=3 CT_DECODE_TK_QKV=2 CT_DECODE_L2_HEAD=max timeout 60 $I --model configs/$m.toml > $R/ids_var_$m.txt 2>/dev/null
  cmp $R/ids_base_$m.txt $R/ids_var_$m.txt && echo "$m ids identical, variants vs default ($(wc -c < $R/ids_base_$m.txt) bytes)"
done
ts done
cd $OUT && tar -czf res.tgz *.txt *.err && rm -f *.txt *.err

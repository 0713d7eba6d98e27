#!/bin/bash
# device call 145: the apart rule as the default (CT_DECODE_ATT_APART=50, attention triggering its
# dependents after its wait): the decode op tests (test_attention_pad), generate_gpu.sh, the same
# ids as without a pad, apart against alone and no pad, then bench/gpu_decode.sh (Transformers
# in the same run; torch.compile at batch 1)
cd /work/main 2>/dev/null || cd "$(dirname "$0")/../../.."
tar -xJf .carry/pack.tar.xz
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64 CT_SOURCE_ROOT=$PWD CT_BUILD_ROOT=$PWD/build-gpu
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
R=$OUT; t0=$(date +%s)
ts() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
ts "test_decode_cuda"; OMP_NUM_THREADS=4 timeout 150 build-gpu/tests/test_decode_cuda > $R/test_decode.txt 2>&1; echo rc $?
grep -iE "fail|mismatch|differ|apart|alone" $R/test_decode.txt | head -14; tail -1 $R/test_decode.txt
ts "bench/gpu_decode.sh"
mkdir -p $R/gd
CTRAIN=build-gpu/ctrain OUT=$R/gd COMPILE_BATCHES=1 timeout 330 bash bench/gpu_decode.sh > $R/gd_stdout.txt 2>&1; echo rc $?
cat $R/gd/gpu_decode.txt
G="build-gpu/ctrain generate --prompt_ids 128 --max_new_tokens 256 --ignore_eos --greedy --precision bf16 --cuda_graphs auto"
ab() { # tag model batches env...
  local tag=$1 m=$2 b=$3; shift 3
  env X=1 "$@" timeout 60 $G --model configs/$m.toml --batch $b 2>$R/ab.err >/dev/null
  echo "$tag: $(grep '^stats' $R/ab.err | awk '{for(i=1;i<=NF;i++){if($i~/^batch=/)b=$i; if($i~/^decode_tok_s=/)t=$i}; print b, t}' | tr '\n' ' ')"
  grep -iE "error|fail" $R/ab.err | head -3
}
ids() { local m=$1; shift; env X=1 "$@" timeout 60 $G --model configs/$m.toml --batch 1,8 --max_new_tokens 48 --print_ids 2>/dev/null | md5sum | cut -c1-12; }
ts "ids qwen3: def $(ids qwen3-0.6b) off $(ids qwen3-0.6b CT_DECODE_ATT_APART=0); llama1b: def $(ids llama3.2-1b) off $(ids llama3.2-1b CT_DECODE_ATT_APART=0)"
for r in 1 2; do
  ab def_$r qwen3-0.6b 1,1,2
  ab alone_$r qwen3-0.6b 1,1,2 CT_DECODE_ATT_ALONE=50
  ab off_$r qwen3-0.6b 1,1,2 CT_DECODE_ATT_APART=0
  ab def_llama1b_$r llama3.2-1b 1,1
  ab alone_llama1b_$r llama3.2-1b 1,1 CT_DECODE_ATT_ALONE=50
  ab def_gpt2_$r gpt2-124m 1,1
done
ts "generate_gpu.sh"; timeout 120 bash tests/gpu/generate_gpu.sh build-gpu/ctrain > $R/generate_gpu.txt 2>&1; echo rc $?
grep -vE "^ok" $R/generate_gpu.txt | tail -4
ts done
(cd $R/gd && ls | grep -vE "^gpu_decode(_raw)?.txt$" | xargs -r rm -f)
rm -f $R/ab.err

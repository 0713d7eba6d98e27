#!/bin/bash
# device call 139: the landed rule (attention's blocks alone where its grid has at most half as
# many blocks as there are multiprocessors): decode op tests, the rule against CT_DECODE_ATT_ALONE=0
# (batch 1 and 2, same process order), the same ids, two more variants with it on (the
# counter merge instead of the cluster; attention prefetching a later kernel's weights into L2), then bench/gpu_decode.sh (Transformers in
# the same run; torch.compile at batch 1)
cd /work/main 2>/dev/null || cd "$(dirname "$0")/../../.."
tar -xJf .carry/pack.tar.xz
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64 CT_SOURCE_ROOT=$PWD CT_BUILD_ROOT=$PWD/build-gpu
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
R=$OUT; t0=$(date +%s)
ts() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
ts "test_decode_cuda"; OMP_NUM_THREADS=4 timeout 150 build-gpu/tests/test_decode_cuda > $R/test_decode.txt 2>&1; echo rc $?
grep -iE "fail|mismatch|alone" $R/test_decode.txt | head -8; tail -1 $R/test_decode.txt
G="build-gpu/ctrain generate --prompt_ids 128 --max_new_tokens 256 --ignore_eos --greedy --precision bf16 --cuda_graphs auto"
ab() { # tag model batches env...
  local tag=$1 m=$2 b=$3; shift 3
  env X=1 "$@" timeout 60 $G --model configs/$m.toml --batch $b 2>$R/ab.err >/dev/null
  echo "$tag: $(grep '^stats' $R/ab.err | awk '{for(i=1;i<=NF;i++){if($i~/^batch=/)b=$i; if($i~/^decode_tok_s=/)t=$i}; print b, t}' | tr '\n' ' ')"
  grep -iE "error|fail" $R/ab.err | head -3
}
ids() { local m=$1; shift; env X=1 "$@" timeout 60 $G --model configs/$m.toml --batch 1,8 --max_new_tokens 48 --print_ids 2>/dev/null | md5sum | cut -c1-12; }
ts "ids qwen3-0.6b (batch 1 and 8): default $(ids qwen3-0.6b) off $(ids qwen3-0.6b CT_DECODE_ATT_ALONE=0)"
for r in 1 2; do
  ab def_qwen3_$r qwen3-0.6b 1,1,2
  ab off_qwen3_$r qwen3-0.6b 1,1,2 CT_DECODE_ATT_ALONE=0
  ab nocluster_qwen3_$r qwen3-0.6b 1,1 CT_DECODE_CLUSTER=0
  ab prefetch_att_qwen3_$r qwen3-0.6b 1,1 CT_DECODE_PREFETCH=att
done
ab def_llama1b llama3.2-1b 1,1,2
ab off_llama1b llama3.2-1b 1,1,2 CT_DECODE_ATT_ALONE=0
ts "bench/gpu_decode.sh"
mkdir -p $R/gd
CTRAIN=build-gpu/ctrain OUT=$R/gd COMPILE_BATCHES=1 timeout 330 bash bench/gpu_decode.sh > $R/gd_stdout.txt 2>&1; echo rc $?
cat $R/gd/gpu_decode.txt
ts done
rm -f $R/ab.err

#!/usr/bin/env bash
# What the next GPU session should run first, in priority order (each PART well under the
# 10-minute call limit on 2 x H200; CUDA build in build-gpu with cuDNN attention; pass COMMIT):
#   checks   golden + every CUDA op (cuDNN attention, the bf16 gradient wire ops) + the GPU smoke
#            suite + the decode op tests on the default and the first-round (CT_DECODE_V2=0) path + generation
#   decode   bench/gpu_decode.sh on the default path, then the first-round kernels (CT_DECODE_V2=0:
#            graphs = no graphs and batch = solo on Qwen3-0.6B, and their tokens/s)
#   ddp      bench/ddp_probe.sh: fp32 vs bf16 gradient wire (parallel.reduce_dtype), bucket 100,
#            GEMMs aimed at 116 of the 132 SMs (CT_CUDA_GEMM_SMS) to leave room for NCCL,
#            with the step phases (CT_STEP_MARKS) of the default
#   perf     bench/gpt2_124m.sh (attention auto now times cuDNN against flash), bench/attention.sh
#            with flash3 (the Hopper wgmma kernels: passed their checks on an H200)
#   llama    bench/qwen3_0p6b.sh (use_kernels on/off vs torch.compile)
#   dist     bench/gpu_dist.sh equiv ckpt fault (passed at 3717b25; rerun after kernel changes)
# usage: bench/gpu_next.sh PART...     results under $OUT (default bench/results)
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0
: "${OUT:=bench/results}"
export OUT
mkdir -p "$OUT"
CT=$PWD/build-gpu/ctrain
: "${COMMIT:=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
tag=$(date +%F)_${ngpu}xH200_$COMMIT
for part in "$@"; do
  echo "== $part"
  {
  echo "# bench/gpu_next.sh $part, $(date -u +%FT%TZ), commit $COMMIT, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x $ngpu"
  case $part in
    checks)
      CT_TEST_BACKEND=cuda timeout 100 build-gpu/tests/test_golden 2>&1 | tail -1
      timeout 300 build-gpu/tests/test_ops_cuda 2>&1 | grep -E "FAIL|MISMATCH|^test:"
      timeout 300 bash tests/gpu/smoke_gpu.sh "$CT" 2>&1 | grep -vE "^ok"
      timeout 120 build-gpu/tests/test_decode_cuda 2>&1 | tail -2
      CT_DECODE_V2=0 timeout 120 build-gpu/tests/test_decode_cuda 2>&1 | tail -2 | sed 's/^/V1: /'
      timeout 300 bash tests/gpu/generate_gpu.sh "$CT" 2>&1 | grep -vE "^ok"
      CT_DECODE_V2=0 timeout 300 bash tests/gpu/generate_gpu.sh "$CT" 2>&1 | grep -vE "^ok" | sed 's/^/V1: /' ;;
    decode)
      CTRAIN=$CT timeout 200 bash bench/gpu_decode.sh
      G="$CT generate --model configs/qwen3-0.6b.toml --prompt_ids 128 --max_new_tokens 256 --ignore_eos --greedy --precision bf16"
      CT_DECODE_V2=0 timeout 90 $G --batch 1,1,8,64 --cuda_graphs auto 2>&1 >/dev/null | grep '^stats' | sed 's/^/V1 /'
      a=$(CT_DECODE_V2=0 timeout 30 $G --batch 1 --max_new_tokens 48 --print_ids --cuda_graphs on 2>/dev/null | md5sum)
      b=$(CT_DECODE_V2=0 timeout 30 $G --batch 1 --max_new_tokens 48 --print_ids --cuda_graphs off 2>/dev/null | md5sum)
      c=$(CT_DECODE_V2=0 timeout 30 $G --batch 3 --max_new_tokens 48 --print_ids 2>/dev/null | sed -n 2p | md5sum)
      d=$(CT_DECODE_V2=0 timeout 30 $G --batch 1 --max_new_tokens 48 --print_ids 2>/dev/null | sed -n 2p | md5sum)
      echo "V1 qwen3-0.6b: graphs = no graphs: $([ "$a" = "$b" ] && echo ok || echo DIFF);" \
           "batch row 0 = solo: $([ "$c" = "$d" ] && echo ok || echo DIFF)" ;;
    ddp)
      MARKS=1 EXTRA="parallel.reduce_dtype=bf16 parallel.bucket_mb=100" ENVS="CT_CUDA_GEMM_SMS=116" \
        timeout 400 bench/ddp_probe.sh build-gpu ;;
    perf) TORCH=compile bench/gpt2_124m.sh build-gpu; ATTN=flash2,flash3,cudnn,auto bench/attention.sh build-gpu ;;
    llama) bench/qwen3_0p6b.sh build-gpu ;;
    dist) bench/gpu_dist.sh equiv ckpt fault ;;
    *) echo "unknown part $part (checks decode ddp perf llama dist)"; exit 2 ;;
  esac
  } 2>&1 | tee "$OUT/gpu_next_${part}_$tag.txt"
done

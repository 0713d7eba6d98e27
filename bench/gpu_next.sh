#!/usr/bin/env bash
# What the next GPU session should run first, in priority order (each PART well under the
# 10-minute call limit on 2 x H200; CUDA build in build-gpu; pass COMMIT):
#   checks   golden + every CUDA op + the GPU smoke suite (kernel registry, CUDA graphs) + the
#            inference tests: everything merged after the last device run (2026-11-30)
#   dist     bench/gpu_dist.sh equiv ckpt fault (ZeRO-2/3 overlap, sharded moments, no_grads)
#   perf     bench/gpt2_124m.sh (regression of the headline), bench/attention.sh
#   llama    bench/qwen3_0p6b.sh, bench/gpu_decode.sh
# usage: bench/gpu_next.sh PART...     results under $OUT (default bench/results)
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0
: "${OUT:=bench/results}"
export OUT
mkdir -p "$OUT"
for part in "$@"; do
  echo "== $part"
  case $part in
    checks)
      CT_TEST_BACKEND=cuda timeout 100 build-gpu/tests/test_golden 2>&1 | tail -1
      timeout 300 build-gpu/tests/test_ops_cuda 2>&1 | grep -E "FAIL|^test:"
      timeout 500 bash tests/gpu/smoke_gpu.sh build-gpu/ctrain 2>&1 | grep -vE "^ok"
      timeout 120 build-gpu/tests/test_decode_cuda 2>&1 | tail -2
      timeout 300 bash tests/gpu/generate_gpu.sh build-gpu/ctrain 2>&1 | grep -vE "^ok" ;;
    dist) bench/gpu_dist.sh equiv ckpt fault ;;
    perf) TORCH=compile bench/gpt2_124m.sh build-gpu; bench/attention.sh build-gpu ;;
    llama) bench/qwen3_0p6b.sh build-gpu; bench/gpu_decode.sh ;;
    *) echo "unknown part $part (checks dist perf llama)"; exit 2 ;;
  esac
done

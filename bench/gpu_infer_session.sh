#!/usr/bin/env bash
# bench/gpu_infer_session.sh — every GPU check of the inference work in one device call (2 GPUs,
# CUDA build in build-gpu): the decode op and engine tests, the generation tests on all tiny HF
# fixtures (GPU = CPU, graphs = no graphs, batch = one by one, 2 GPUs = 1), then
# bench/gpu_decode.sh with Transformers (eager and static cache + torch.compile). About 8 minutes.
# Results under $OUT (default bench/results).
: "${OUT:=bench/results}"
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0
mkdir -p "$OUT"
echo "== decode ops + engine"; timeout 120 build-gpu/tests/test_decode_cuda 2>&1 | tail -4
echo "== generation tests"; timeout 300 bash tests/gpu/generate_gpu.sh build-gpu/ctrain 2>&1 | grep -v '^ok'
echo "== decode benchmark"
OUT="$OUT" CTRAIN=build-gpu/ctrain COMPILE_TIMEOUT=400 timeout 560 bash bench/gpu_decode.sh 2>&1 | tail -24

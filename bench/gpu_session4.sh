#!/usr/bin/env bash
# One batched 2-GPU device call for issue #6 after merging the multi-GPU work: the CUDA golden
# test on the merged tree, then bench/gpu_dist.sh parts in priority order (whatever the device
# budget allows; each part writes $OUT/gpu_dist_<part>.txt as it finishes).
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0
: "${OUT:=bench/results}"
mkdir -p "$OUT"
echo "== golden (CUDA)"; CT_TEST_BACKEND=cuda timeout 100 ./build-gpu/tests/test_golden 2>&1 | tail -1
OUT=$OUT bench/gpu_dist.sh ${PARTS:-equiv ckpt fault bench comm torch}

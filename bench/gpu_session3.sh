#!/usr/bin/env bash
# Batched device call (issue #5 closing run): CUDA op correctness for all three tables, golden
# whole-model comparison on CUDA, the GPU smoke suite, perf of the fused ops, then
# bench/gpt2_124m.sh (ctrain vs PyTorch eager and torch.compile, same GPU, same run).
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0
: "${OUT:=bench/results}"
mkdir -p "$OUT" data
{
echo "== ops correctness"; timeout 300 ./build-gpu/tests/test_ops_cuda 2>&1 | grep -E "FAIL|^test:|add_norm|gelu" | tail -30
echo "== golden (CUDA)"; CT_TEST_BACKEND=cuda timeout 200 ./build-gpu/tests/test_golden 2>&1 | tail -2
echo "== perf (bf16)"; for op in add_norm gelu; do timeout 200 ./build-gpu/tests/test_ops_cuda --perf --dtype bf16 --op $op 2>&1 | grep -E "^  [a-z]" | grep -v "^  op"; done
} 2>&1 | tee "$OUT/gpu_tests.txt"
bench/gpt2_124m.sh build-gpu

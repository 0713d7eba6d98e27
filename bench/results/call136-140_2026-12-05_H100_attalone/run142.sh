#!/bin/bash
# device call 142: test_decode_cuda after test_attention_alone asks for the rule at up to one block
# a multiprocessor (CT_DECODE_ATT_ALONE=100), so that a GPU with fewer multiprocessors runs it too
cd /work/main 2>/dev/null || cd "$(dirname "$0")/../../.."
tar -xJf .carry/pack.tar.xz
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64 CT_SOURCE_ROOT=$PWD CT_BUILD_ROOT=$PWD/build-gpu
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
OMP_NUM_THREADS=4 timeout 150 build-gpu/tests/test_decode_cuda > $OUT/test_decode.txt 2>&1; echo rc $?
grep -iE "fail|mismatch|alone" $OUT/test_decode.txt | head -8; tail -1 $OUT/test_decode.txt

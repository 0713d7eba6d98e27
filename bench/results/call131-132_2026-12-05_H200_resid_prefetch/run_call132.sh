#!/bin/bash
# device call 132 (the command given to the device tool): bench/gpu_decode.sh on the HEAD~ build
tar -xJf .carry/pack.tar.xz && export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64 && CTRAIN=build-gpu/ctrain-base OUT=$OUT/gd COMPILE_TIMEOUT=180 timeout 380 bash bench/gpu_decode.sh > $OUT/gd_stdout.txt 2>&1; echo rc $?; tail -24 $OUT/gd_stdout.txt

#!/bin/bash
# device call A: decode op tests on the working tree's build, an A/B of decode tokens/s against
# the HEAD~ build (build-gpu/ctrain-base, interleaved), token identity, the 2-device test
cd "$(dirname "$0")/.." && tar -xJf .carry/pack.tar.xz
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64 CT_SOURCE_ROOT=$PWD CT_BUILD_ROOT=$PWD/build-gpu OMP_NUM_THREADS=2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
R=$OUT; t0=$(date +%s)
ts() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
ts "test_decode_cuda"; timeout 200 build-gpu/tests/test_decode_cuda > $R/test_decode.txt 2>&1; echo rc $?; grep -iE "fail|mismatch" $R/test_decode.txt | head; tail -1 $R/test_decode.txt
ab() { # tag binary model batches [env]
  env ${5:-X=1} timeout 60 build-gpu/$2 generate --model configs/$3.toml --prompt_ids 128 --batch $4 --max_new_tokens 256 --ignore_eos --greedy --precision bf16 --cuda_graphs auto 2>&1 >/dev/null | grep '^stats' > $R/ab_$1.txt
  echo "$1: $(awk '{for(i=1;i<=NF;i++){if($i~/^batch=/)b=$i; if($i~/^decode_tok_s=/)t=$i}; print b, t}' $R/ab_$1.txt | tr '\n' ' ')"
}
ts "A/B"
for r in 1 2; do
  ab q_base$r ctrain-base qwen3-0.6b 1,1,8,16; ab q_new$r ctrain qwen3-0.6b 1,1,8,16
  ab g_base$r ctrain-base gpt2-124m 1,1,8; ab g_new$r ctrain gpt2-124m 1,1,8
done
ts "ids"
for b in ctrain ctrain-base; do for m in qwen3-0.6b gpt2-124m; do
  timeout 60 build-gpu/$b generate --model configs/$m.toml --prompt_ids 16 --batch 1,5,12 --max_new_tokens 48 --print_ids --greedy --precision bf16 --cuda_graphs auto > $R/ids_${b}_$m.txt 2>/dev/null
done; done
for m in qwen3-0.6b gpt2-124m; do cmp $R/ids_ctrain_$m.txt $R/ids_ctrain-base_$m.txt && echo "$m ids identical new vs base ($(wc -c < $R/ids_ctrain_$m.txt) bytes)"; done
ts "decode_cuda_2dev"; CT_CUDA_VIRTUAL_DEVICES=2 timeout 200 build-gpu/tests/test_decode_cuda > $R/test_decode_2dev.txt 2>&1; echo rc $?; grep -iE "fail|mismatch" $R/test_decode_2dev.txt | head; tail -1 $R/test_decode_2dev.txt
if [ $(( $(date +%s) - t0 )) -lt 250 ]; then
ts "generate_gpu.sh"; timeout 240 bash tests/gpu/generate_gpu.sh $PWD/build-gpu/ctrain > $R/generate_gpu.txt 2>&1; echo rc $?; grep -vE "^ok" $R/generate_gpu.txt | tail -12
fi
ts done
cd $OUT && tar -czf res.tgz *.txt && rm -f *.txt

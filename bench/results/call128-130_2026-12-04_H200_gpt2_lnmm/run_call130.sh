#!/bin/bash
# device run: unpack, decode tests, generate tests, GPT-2 sweep fused LN vs CT_DECODE_LNMM=0, others default
cd "$(dirname "$0")/.." && tar -xJf .carry/pack.tar.xz
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64
R=$OUT/res; mkdir -p $R
echo "== test_decode_cuda"; timeout 150 build-gpu/tests/test_decode_cuda > $R/test_decode.txt 2>&1; echo rc $?; grep -i "fail" $R/test_decode.txt | head; tail -1 $R/test_decode.txt
echo "== generate_gpu.sh"; timeout 200 bash tests/gpu/generate_gpu.sh $PWD/build-gpu/ctrain > $R/generate_gpu.txt 2>&1; echo rc $?; tail -1 $R/generate_gpu.txt
sweep() { # tag model env...
  local tag=$1 m=$2; shift 2
  env "$@" timeout 60 build-gpu/ctrain generate --model configs/$m.toml --prompt_ids 128 --batch 1,1,8,16,32,64 \
      --max_new_tokens 256 --ignore_eos --greedy --precision bf16 --cuda_graphs auto 2>&1 >/dev/null | grep '^stats' > $R/gen_${m}_$tag.txt
  echo "$m $tag: $(awk '{for(i=1;i<=NF;i++){if($i~/^batch=/)b=$i; if($i~/^decode_tok_s=/)t=$i}; print b, t}' $R/gen_${m}_$tag.txt | tail -5 | tr '\n' ' ')"
}
for r in 1 2; do sweep lnmm$r gpt2-124m CT_X=1; sweep off$r gpt2-124m CT_DECODE_LNMM=0; done
sweep def llama3.2-1b CT_X=1
# token identity fused vs composed on GPT-2
for e in 1 0; do CT_DECODE_LNMM=$e timeout 60 build-gpu/ctrain generate --model configs/gpt2-124m.toml --prompt_ids 16 --batch 4,12 --max_new_tokens 32 --print_ids --greedy --precision bf16 --cuda_graphs auto > $R/ids_$e.txt 2>/dev/null; done
wc -c $R/ids_*.txt; cmp $R/ids_1.txt $R/ids_0.txt && echo "ids identical fused vs composed"
echo "== gpu_decode.sh"; CTRAIN=build-gpu/ctrain OUT=$R/gd COMPILE_TIMEOUT=200 timeout 330 bash bench/gpu_decode.sh > $R/gd_stdout.txt 2>&1; echo rc $?; tail -22 $R/gd_stdout.txt
cd $OUT && tar -czf res.tgz res && rm -rf res

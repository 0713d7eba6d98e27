#!/usr/bin/env bash
# One batched device call: op profile of the GPT-2 124M step at B=64, then the headline bench.
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0
: "${OUT:=bench/results}"
mkdir -p "$OUT" data
./build-gpu/ctrain prepare --out-dir data/bench /usr/lib/python3*/*.py /usr/lib/python3*/*/*.py >/dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv
S="model.arch=gpt2 model.n_layer=12 model.d_model=768 model.n_head=12 model.d_ff=3072 model.vocab_size=50304 model.max_seq_len=1024 data.train=data/bench/train.h5 data.val= train.seq_len=1024 train.micro_batch=${B:-64} train.eval_every=0 train.sample_tokens=0 train.checkpoint_every=0 train.precision=bf16"
CT_CUDA_PROFILE=1 ./build-gpu/ctrain train configs/smoke.toml $S train.max_steps=6 train.out_dir=/tmp/prof > "$OUT/profile_b64.txt" 2>&1
grep -E "step_ms" /tmp/prof/metrics.jsonl | tail -3 >> "$OUT/profile_b64.txt"
head -60 "$OUT/profile_b64.txt" | grep -v "^\[" | tail -50
TORCH="${TORCH-compile}" bench/gpt2_124m.sh build-gpu

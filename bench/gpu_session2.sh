#!/usr/bin/env bash
# Batched device call: CUDA op correctness (all tables), whole-model golden on CUDA, the GPU smoke
# suite, perf of the B=64-scale cases, the op profile of the GPT-2 124M B=64 step, and
# throughput with CUDA graphs on/off at B=64 and B=4.
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0
: "${OUT:=bench/results}"
mkdir -p "$OUT" data
echo "== ops correctness"; timeout 300 ./build-gpu/tests/test_ops_cuda 2>&1 | grep -E "FAIL|^test:" | tail -30
echo "== golden (CUDA)"; CT_TEST_BACKEND=cuda timeout 200 ./build-gpu/tests/test_golden 2>&1 | tail -3
echo "== smoke_gpu"; CTRAIN=$PWD/build-gpu/ctrain timeout 400 bash tests/gpu/smoke_gpu.sh $PWD/build-gpu/ctrain 2>&1 | tail -12
echo "== perf"; for op in layernorm rmsnorm embed_bwd xent; do timeout 200 ./build-gpu/tests/test_ops_cuda --perf --dtype bf16 --op $op 2>&1 | grep -E "^  [a-z]"; done
./build-gpu/ctrain prepare --out-dir data/bench /usr/lib/python3*/*.py /usr/lib/python3*/*/*.py >/dev/null 2>&1
S="model.arch=gpt2 model.n_layer=12 model.d_model=768 model.n_head=12 model.d_ff=3072 model.vocab_size=50304 model.max_seq_len=1024 data.train=data/bench/train.h5 data.val= train.seq_len=1024 train.eval_every=0 train.sample_tokens=0 train.checkpoint_every=0 train.precision=bf16"
CT_CUDA_PROFILE=1 ./build-gpu/ctrain train configs/smoke.toml $S train.micro_batch=64 train.max_steps=6 train.cuda_graphs=off train.out_dir=/tmp/prof > "$OUT/profile_b64.txt" 2>&1
sed -n '/cuda op profile/,$p' "$OUT/profile_b64.txt" | head -32
for b in 64 4; do for gr in off on; do
  ./build-gpu/ctrain train configs/smoke.toml $S train.micro_batch=$b train.max_steps=25 train.cuda_graphs=$gr train.out_dir=/tmp/g$b$gr >/dev/null 2>&1
  python3 -c "
import json,statistics; r=[json.loads(l) for l in open('/tmp/g$b$gr/metrics.jsonl') if 'step_ms' in l][5:]
print('B=$b cuda_graphs=$gr: median %.2f ms/step, %.0f tok/s' % (statistics.median(x['step_ms'] for x in r), statistics.median(x['tokens_per_s'] for x in r)))"
done; done

#!/usr/bin/env bash
# bench/gpu_validate.sh — one batched GPU session (run on a 2-GPU machine from the repo root with a
# CUDA build in build-gpu): NCCL collectives, the CUDA op tests, bf16 smoke training and generate,
# 2-GPU DDP against 1 GPU with accumulation (equivalence and scaling), then bench/gpu_train.sh.
# Results go to $OUT (default bench/results).
: "${OUT:=bench/results}"
set -x
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0
nvidia-smi -L
mkdir -p data $OUT
./build-gpu/ctrain prepare --out-dir data/fortunes /usr/lib/python3*/*.py 2>&1 | tail -1
timeout 120 ./build-gpu/tests/test_comm_nccl 2>&1 | tail -14
timeout 60 ./build-gpu/tests/test_ops_cuda --small 2>&1 | tail -2
./build-gpu/ctrain train configs/smoke.toml train.out_dir=/tmp/smoke 2>&1 | grep -E "device|val_loss|done"
./build-gpu/ctrain generate --model /tmp/smoke --prompt "def " --max_new_tokens 60 --seed 1 2>&1 | tail -3
G="configs/smoke.toml model.n_layer=12 model.d_model=768 model.n_head=12 model.vocab_size=50257 model.max_seq_len=1024 train.seq_len=1024 train.max_steps=20 train.eval_every=0 train.sample_tokens=0 data.val= train.warmup_steps=5 train.lr=6e-4"
./build-gpu/ctrain train $G train.micro_batch=8 train.grad_accum=2 train.out_dir=/tmp/one 2>&1 | grep -E "done"
./build-gpu/ctrain-launch --nproc_per_node gpu --standalone $G train.micro_batch=8 train.out_dir=/tmp/two 2>&1 | grep -E "distributed|done|error"
./build-gpu/ctrain train $G train.micro_batch=16 train.out_dir=/tmp/onebig 2>&1 | grep -E "done"
./build-gpu/ctrain-launch --nproc_per_node gpu --standalone $G train.micro_batch=16 train.out_dir=/tmp/twobig 2>&1 | grep -E "done|error"
python3 - <<'PY' | tee $OUT/ddp_2gpu.txt
import json, statistics
def rows(d): return [json.loads(l) for l in open(d + "/metrics.jsonl") if '"tokens_per_s"' in l]
a, b = rows("/tmp/one"), rows("/tmp/two")
worst = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b))
print(f"2 GPUs (DDP, NCCL, bf16) vs 1 GPU with grad_accum 2, same global batch 16x1024: {len(a)} steps, worst relative loss difference {worst:.2e}")
for one, two in (("/tmp/one", "/tmp/two"), ("/tmp/onebig", "/tmp/twobig")):
    t1 = statistics.median(r["tokens_per_s"] for r in rows(one)[3:])
    t2 = statistics.median(r["tokens_per_s"] for r in rows(two)[3:])
    print(f"{one}: 1 GPU {t1:.0f} tok/s, 2 GPUs {t2:.0f} tok/s global, scaling efficiency {t2 / (2 * t1):.3f}")
PY
STEPS=10 MODES="bf16 bf16+compile fp32" timeout 300 bash bench/gpu_train.sh build-gpu
cp bench/results/gpu_train_* $OUT/

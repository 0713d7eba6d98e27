#!/usr/bin/env bash
# bench/gpu_validate2.sh — second batched GPU session (2-GPU machine, CUDA build in build-gpu):
# CUDA op tests for every table, the CUDA_VISIBLE_DEVICES mapping, greedy generate on the GPU
# (fp32) equal to the CPU backend for the tiny HF fixtures, fp16 training with dynamic loss
# scaling, and ZeRO-1 against DDP on 2 GPUs. Results go to $OUT (default bench/results).
: "${OUT:=bench/results}"
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0
mkdir -p data "$OUT"
./build-gpu/ctrain prepare --out-dir data/fortunes /usr/lib/python3*/*.py >/dev/null 2>&1
echo "== ops (fp32, bf16, fp16 tables)"; timeout 120 ./build-gpu/tests/test_ops_cuda --small --dtype all 2>&1 | tail -3
echo "== CUDA_VISIBLE_DEVICES mapping"
nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader
for v in 0 1 1,0 ""; do echo "CUDA_VISIBLE_DEVICES=$v:"; CUDA_VISIBLE_DEVICES=$v ./build-gpu/ctrain env | grep -E "cuda:|devices:"; done
echo "== greedy generate: GPU fp32 vs CPU backend"
for m in gpt2 llama_gqa qwen3 qwen2; do
  g=$(./build-gpu/ctrain generate --model tests/fixtures/hf/$m --prompt "The" --max_new_tokens 20 --greedy --precision fp32 2>/dev/null | od -An -tx1 | tr -d ' \n')
  c=$(CUDA_VISIBLE_DEVICES= ./build-gpu/ctrain generate --model tests/fixtures/hf/$m --prompt "The" --max_new_tokens 20 --greedy 2>/dev/null | od -An -tx1 | tr -d ' \n')
  [ -n "$g" ] && [ "$g" = "$c" ] && echo "$m: identical" || echo "$m: DIFFERENT"
done
S="configs/smoke.toml train.sample_tokens=0"
echo "== smoke: bf16 vs fp16 (dynamic loss scaling)"
for p in bf16 fp16; do ./build-gpu/ctrain train $S train.precision=$p train.out_dir=/tmp/s_$p 2>&1 | grep -E "device|loss scal|skipped|final val_loss"; done
echo "== ZeRO-1 vs DDP on 2 GPUs (GPT-2 124M shape, bf16)"
G="configs/smoke.toml model.n_layer=12 model.d_model=768 model.n_head=12 model.vocab_size=50257 model.max_seq_len=1024 train.seq_len=1024 train.max_steps=20 train.eval_every=0 train.sample_tokens=0 data.val= train.warmup_steps=5 train.lr=6e-4 train.micro_batch=16"
for d in ddp zero1; do ./build-gpu/ctrain-launch --nproc_per_node gpu --standalone $G parallel.data=$d train.out_dir=/tmp/z_$d 2>&1 | grep -E "done|error"; done
python3 - <<'PY' | tee "$OUT/zero1_2gpu.txt"
import json, statistics
rows = lambda d: [json.loads(l) for l in open(d + "/metrics.jsonl") if '"tokens_per_s"' in l]
a, b = rows("/tmp/z_ddp"), rows("/tmp/z_zero1")
print("zero1 vs ddp, 2 GPUs: worst relative loss difference %.2e over %d steps" % (max(abs(x["loss"] - y["loss"]) / x["loss"] for x, y in zip(a, b)), len(a)))
for n, r in (("ddp", a), ("zero1", b)):
    print("%s: %.0f tokens/s (median, 2 GPUs)" % (n, statistics.median(x["tokens_per_s"] for x in r[3:])))
PY

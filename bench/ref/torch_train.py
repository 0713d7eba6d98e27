#!/usr/bin/env python3
"""PyTorch side of the GPU training benchmark (bench/gpu_train.sh).

Builds the same model as ctrain with Hugging Face Transformers (GPT2LMHeadModel / LlamaForCausalLM,
dropout 0, sdpa attention), trains it on random tokens on one GPU with AdamW (lr 3e-4, wd 0.1 on
2-D params, betas 0.9/0.95) and global-norm clipping 1.0, and times `--steps` steps after
`--warmup` steps (torch.cuda.synchronize around each). Modes: --precision fp32|tf32|bf16
(bf16 = torch.autocast, fp32 master weights, as ctrain's mixed precision), --compile.
Prints exactly one JSON line on stdout.

    python3 bench/ref/torch_train.py --arch gpt2 --n_layer 12 --d_model 768 --n_head 12 \
        --vocab_size 50257 --seq_len 1024 --micro_batch 16 --steps 20 --precision bf16 --compile
"""
import argparse
import contextlib
import json
import statistics
import sys
import time

T_START = time.perf_counter()  # time to first step counts from here (imports included)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=["gpt2", "llama", "qwen3"], required=True)
    ap.add_argument("--head_dim", type=int, default=None)
    ap.add_argument("--tie", action="store_true", help="tied embeddings (llama/qwen3)")
    ap.add_argument("--rope_theta", type=float, default=10000.0)
    ap.add_argument("--n_layer", type=int, required=True)
    ap.add_argument("--d_model", type=int, required=True)
    ap.add_argument("--n_head", type=int, required=True)
    ap.add_argument("--n_kv_head", type=int, default=None)
    ap.add_argument("--d_ff", type=int, default=None)
    ap.add_argument("--vocab_size", type=int, required=True)
    ap.add_argument("--seq_len", type=int, required=True)
    ap.add_argument("--micro_batch", type=int, required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="fp32")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--peak_tflops", type=float, default=989.0,
                    help="dense bf16 peak for MFU (H100/H200 SXM: 989)")
    a = ap.parse_args()
    a.n_kv_head = a.n_kv_head or a.n_head
    a.d_ff = a.d_ff or 4 * a.d_model

    import torch
    import torch.nn.functional as F
    import transformers

    real_stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
        torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
        torch.manual_seed(0)
        if a.arch == "gpt2":
            cfg = transformers.GPT2Config(
                vocab_size=a.vocab_size, n_positions=a.seq_len, n_embd=a.d_model,
                n_layer=a.n_layer, n_head=a.n_head, n_inner=a.d_ff,
                activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                attn_pdrop=0.0, tie_word_embeddings=True, use_cache=False)
            cls = transformers.GPT2LMHeadModel
        elif a.arch == "qwen3":  # Qwen3: GQA, q/k RMSNorm, explicit head_dim
            cfg = transformers.Qwen3Config(
                vocab_size=a.vocab_size, hidden_size=a.d_model, intermediate_size=a.d_ff,
                num_hidden_layers=a.n_layer, num_attention_heads=a.n_head,
                num_key_value_heads=a.n_kv_head, head_dim=a.head_dim or a.d_model // a.n_head,
                max_position_embeddings=a.seq_len, rope_theta=a.rope_theta,
                tie_word_embeddings=a.tie, use_cache=False)
            cls = transformers.Qwen3ForCausalLM
        else:
            cfg = transformers.LlamaConfig(
                vocab_size=a.vocab_size, hidden_size=a.d_model, intermediate_size=a.d_ff,
                num_hidden_layers=a.n_layer, num_attention_heads=a.n_head,
                num_key_value_heads=a.n_kv_head, max_position_embeddings=a.seq_len,
                tie_word_embeddings=False, use_cache=False)
            cls = transformers.LlamaForCausalLM
        model = cls._from_config(cfg, attn_implementation="sdpa").float().cuda().train()
        params = list(model.parameters())
        n_params = sum(p.numel() for p in params)
        opt = torch.optim.AdamW(
            [{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
             {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
        fwd = torch.compile(model) if a.compile else model
        n = a.warmup + a.steps
        x = torch.randint(0, a.vocab_size, (n, a.micro_batch, a.seq_len), device="cuda")
        y = torch.randint(0, a.vocab_size, (n, a.micro_batch, a.seq_len), device="cuda")
        amp = (torch.autocast("cuda", dtype=torch.bfloat16) if a.precision == "bf16"
               else contextlib.nullcontext())

        def step(i):
            opt.zero_grad(set_to_none=True)
            with amp:
                logits = fwd(input_ids=x[i]).logits
                loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y[i].view(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            return loss

        step_ms = []
        for i in range(a.warmup):
            t0 = time.perf_counter()
            step(i)
            torch.cuda.synchronize()
            if i == 0:
                first_step_s = time.perf_counter() - T_START
            step_ms.append(1e3 * (time.perf_counter() - t0))
        times = []
        for i in range(a.warmup, n):
            t0 = time.perf_counter()
            loss = step(i)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        peak = torch.cuda.max_memory_allocated() / 2**30
    tok = a.micro_batch * a.seq_len
    # MFU as the issue defines it: 6N + 6 L T d FLOPs per token (N without position embeddings)
    n_mfu = n_params - (a.seq_len * a.d_model if a.arch == "gpt2" else 0)
    if a.arch != "gpt2" and a.tie:  # the tied head is a matmul too
        n_mfu += a.vocab_size * a.d_model
    flops_tok = 6 * n_mfu + 6 * a.n_layer * a.seq_len * a.d_model
    tps = tok / statistics.median(times)
    print(json.dumps({
        "impl": "pytorch" + ("+compile" if a.compile else ""), "precision": a.precision,
        "torch": str(torch.__version__), "gpu": torch.cuda.get_device_name(),
        "tokens_per_s": tps, "step_ms_median": 1e3 * statistics.median(times),
        "mfu": tps * flops_tok / (a.peak_tflops * 1e12), "first_step_s": round(first_step_s, 2),
        "warmup_ms": [round(x, 1) for x in step_ms],
        "peak_gib": round(peak, 2), "params": n_params, "loss": float(loss)}), file=real_stdout)


if __name__ == "__main__":
    main()

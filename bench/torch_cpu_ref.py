#!/usr/bin/env python3
"""PyTorch side of ctrain's CPU training benchmark (reference only, not part of the product).

Builds the same model as ctrain with Hugging Face Transformers, fp32 on the CPU, and
times full training steps: zero_grad, forward, cross-entropy on a random token batch,
backward, clip_grad_norm_(1.0), AdamW step.

    pip install torch transformers
    python3 bench/torch_cpu_ref.py --arch gpt2 --n_layer 4 --d_model 128 --n_head 4 \\
        --vocab_size 257 --seq_len 128 --micro_batch 16 --threads 2 --steps 20 --warmup 3

Models: gpt2 = GPT2LMHeadModel (gelu_new, tied embeddings, dropout 0, d_ff default 4C);
llama = LlamaForCausalLM (SwiGLU, RMSNorm eps 1e-5, RoPE theta 1e4, untied lm_head,
no biases, d_ff default 4C, n_kv_head default n_head). Attention is sdpa.
AdamW: lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on params with ndim >= 2.

Prints exactly one JSON line on stdout:
  {"impl": "pytorch", "torch": ..., "threads": N, "tokens_per_s": ...,
   "step_ms_median": ..., "params": ...}
tokens_per_s = steps * micro_batch * seq_len / (total time of the timed steps).
Everything else (library warnings) goes to stderr.
"""

import argparse
import contextlib
import json
import statistics
import sys
import time


def parse_args():
    ap = argparse.ArgumentParser(description="PyTorch CPU training-step benchmark")
    ap.add_argument("--arch", choices=["gpt2", "llama"], required=True)
    ap.add_argument("--n_layer", type=int, required=True)
    ap.add_argument("--d_model", type=int, required=True)
    ap.add_argument("--n_head", type=int, required=True)
    ap.add_argument("--n_kv_head", type=int, default=None, help="llama only; default n_head")
    ap.add_argument("--d_ff", type=int, default=None, help="default 4*d_model")
    ap.add_argument("--vocab_size", type=int, required=True)
    ap.add_argument("--seq_len", type=int, required=True)
    ap.add_argument("--micro_batch", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.d_model % a.n_head:
        ap.error("d_model must be divisible by n_head")
    if a.n_kv_head is None:
        a.n_kv_head = a.n_head
    if a.arch == "gpt2" and a.n_kv_head != a.n_head:
        ap.error("gpt2 has no grouped-query attention (n_kv_head must equal n_head)")
    if a.n_head % a.n_kv_head:
        ap.error("n_head must be divisible by n_kv_head")
    if a.d_ff is None:
        a.d_ff = 4 * a.d_model
    if a.steps < 1 or a.warmup < 0:
        ap.error("need steps >= 1 and warmup >= 0")
    return a


def build_model(a):
    import transformers
    if a.arch == "gpt2":
        cfg = transformers.GPT2Config(
            vocab_size=a.vocab_size, n_positions=a.seq_len, n_embd=a.d_model,
            n_layer=a.n_layer, n_head=a.n_head, n_inner=a.d_ff,
            activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            layer_norm_epsilon=1e-5, tie_word_embeddings=True, use_cache=False,
            bos_token_id=None, eos_token_id=None)
        cls = transformers.GPT2LMHeadModel
    else:
        cfg = transformers.LlamaConfig(
            vocab_size=a.vocab_size, hidden_size=a.d_model, intermediate_size=a.d_ff,
            num_hidden_layers=a.n_layer, num_attention_heads=a.n_head,
            num_key_value_heads=a.n_kv_head, head_dim=a.d_model // a.n_head,
            max_position_embeddings=a.seq_len, rms_norm_eps=1e-5, hidden_act="silu",
            tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
            attention_dropout=0.0, use_cache=False,
            bos_token_id=None, eos_token_id=None, pad_token_id=None)
        cls = transformers.LlamaForCausalLM
    model = cls._from_config(cfg, attn_implementation="sdpa")
    return model.float().cpu().train()


def main():
    a = parse_args()
    import torch
    # before any parallel work is started
    torch.set_num_interop_threads(1)
    torch.set_num_threads(a.threads)
    import torch.nn.functional as F

    real_stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):  # keep stdout for the one JSON line
        torch.manual_seed(a.seed)
        model = build_model(a)
        params = list(model.parameters())  # tied weights counted once
        n_params = sum(p.numel() for p in params)
        opt = torch.optim.AdamW(
            [{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
             {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
            lr=3e-4, betas=(0.9, 0.95), eps=1e-8)

        gen = torch.Generator().manual_seed(a.seed + 1)
        n_batches = a.warmup + a.steps
        shape = (n_batches, a.micro_batch, a.seq_len)
        inputs = torch.randint(0, a.vocab_size, shape, generator=gen)
        targets = torch.randint(0, a.vocab_size, shape, generator=gen)

        def step(i):
            opt.zero_grad(set_to_none=True)
            logits = model(input_ids=inputs[i]).logits
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets[i].view(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            return loss.item()

        for i in range(a.warmup):
            step(i)
        times = []
        for i in range(a.warmup, n_batches):
            t0 = time.perf_counter()
            loss = step(i)
            times.append(time.perf_counter() - t0)
        if not (loss == loss):
            raise SystemExit("loss is NaN")

    total = sum(times)
    out = {
        "impl": "pytorch",
        "torch": str(torch.__version__),
        "threads": a.threads,
        "tokens_per_s": a.steps * a.micro_batch * a.seq_len / total,
        "step_ms_median": 1000.0 * statistics.median(times),
        "params": n_params,
    }
    print(json.dumps(out), file=real_stdout)


if __name__ == "__main__":
    main()

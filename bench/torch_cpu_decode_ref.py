#!/usr/bin/env python3
"""bench/torch_cpu_decode_ref.py — the Transformers side of bench/cpu_decode.sh (reference only,
not part of the product).

Loads a GGUF causal LM with Transformers (which dequantizes it to float32, as `ctrain
import-gguf` does), or with --gpt2_random N a GPT2LMHeadModel of GPT-2 124M's shape with random
weights and a random prompt of N ids, on the CPU with --threads threads, and times greedy
`generate` with no end of text (min_new_tokens = max_new_tokens) for a batch of B copies of the
prompt: time to first token = generate with max_new_tokens=1; decode tokens/s = B * (new - 1) /
(t_new - t_1) (medians over --reps). Attention: --attn (sdpa or eager). Prints one JSON line per batch size
on stdout, with the first sequence's new ids; library warnings go to stderr.

    python3 bench/torch_cpu_decode_ref.py --gguf FILE.gguf --prompt "NVIDIA GPUs are" \\
        --new 64 --batches 1,4 --threads 2
"""
import argparse, json, os, sys, time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf")
    ap.add_argument("--gpt2_random", type=int, default=0, metavar="N")
    ap.add_argument("--prompt", default="NVIDIA GPUs are")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--batches", default="1")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--attn", default="sdpa")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.gpt2_random:
        torch.manual_seed(0)
        cfg = GPT2Config()
        cfg._attn_implementation = a.attn
        m = GPT2LMHeadModel(cfg)
        ids0 = torch.randint(0, 50257, (1, a.gpt2_random))
    else:
        d, f = os.path.dirname(os.path.abspath(a.gguf)), os.path.basename(a.gguf)
        tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
        m = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32,
                                                 attn_implementation=a.attn)
        ids0 = tok(a.prompt, return_tensors="pt").input_ids
    m.eval()
    m.generation_config.eos_token_id = None
    m.generation_config.pad_token_id = 0
    for B in [int(b) for b in a.batches.split(",")]:
        ids = ids0.repeat(B, 1)
        kw = dict(do_sample=False, attention_mask=torch.ones_like(ids), pad_token_id=0)

        def gen(n):
            with torch.inference_mode():
                return m.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)

        gen(4)  # warm-up
        t1, tn, out = [], [], None
        for _ in range(a.reps):
            t = time.perf_counter()
            gen(1)
            t1.append(time.perf_counter() - t)
            t = time.perf_counter()
            out = gen(a.new)
            tn.append(time.perf_counter() - t)
        ttft, total = median(t1), median(tn)
        print(json.dumps({"impl": "transformers", "torch": torch.__version__, "attn": a.attn,
                          "threads": a.threads, "batch": B, "prompt_tokens": ids.shape[1],
                          "new_tokens": a.new, "ttft_ms": ttft * 1e3,
                          "decode_tok_s": B * (a.new - 1) / (total - ttft),
                          "ids": out[0, ids.shape[1]:].tolist()}), flush=True)


if __name__ == "__main__":
    sys.exit(main())

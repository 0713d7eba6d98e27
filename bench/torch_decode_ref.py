#!/usr/bin/env python3
"""bench/torch_decode_ref.py — the Transformers side of bench/gpu_decode.sh.

Qwen3ForCausalLM built from a config with the Qwen3-0.6B shape (28 layers, d=1024, 16 heads,
8 kv heads, head_dim 128, qk_norm, SwiGLU 3072, vocab 151,936, tied embeddings), random
weights, bf16, sdpa attention. For each batch size: random prompts of --prompt tokens, greedy
`generate` of --new tokens with no end-of-text (min_new_tokens = max_new_tokens). Time to first
token = generate with max_new_tokens=1; decode tokens/s = B * (new - 1) / (t_new - t_1).
Modes: "eager" (dynamic cache) and "static_compile" (static cache; generate compiles the decode
forward with torch.compile, CompileConfig fullgraph + reduce-overhead; reported with its error if
it fails). One JSON line per result. --arch gpt2: GPT2LMHeadModel with the GPT-2 124M shape
(12 layers, d=768, 12 heads, vocab 50,257, context 1,024) instead, the same modes. --config
CFG.toml (a ctrain model config with arch "llama"): the shape is read from its [model] table,
Qwen3ForCausalLM when it has qk_norm, else LlamaForCausalLM (e.g. configs/llama3.2-1b.toml).
"""
import argparse, json, sys, time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def llama_from_toml(path):
    """Qwen3Config / LlamaConfig with the shape of a ctrain config's [model] table."""
    import tomllib
    with open(path, "rb") as f:
        c = tomllib.load(f)["model"]
    if c.get("arch") != "llama":
        raise SystemExit("%s: [model] arch is %r; --config takes a llama-arch config" % (path, c.get("arch")))
    kw = dict(vocab_size=c["vocab_size"], hidden_size=c["d_model"], intermediate_size=c["d_ff"],
              num_hidden_layers=c["n_layer"], num_attention_heads=c["n_head"],
              num_key_value_heads=c.get("n_kv_head", c["n_head"]),
              head_dim=c.get("head_dim", c["d_model"] // c["n_head"]), max_position_embeddings=4096,
              rope_theta=c.get("rope_theta", 10000.0), rms_norm_eps=c.get("norm_eps", 1e-5),
              tie_word_embeddings=c.get("tie_embeddings", False))
    if c.get("qk_norm"):
        return Qwen3Config(**kw), Qwen3ForCausalLM
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaConfig(**kw), LlamaForCausalLM


def build(seed, arch="qwen3", config=None):
    if arch == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)
        cfg._attn_implementation = "sdpa"
        torch.manual_seed(seed)
        with torch.device("cuda"):
            m = GPT2LMHeadModel(cfg).to(torch.bfloat16)
        m.eval()
        m.generation_config.pad_token_id = 0
        m.generation_config.eos_token_id = None
        return m
    if config:
        cfg, cls = llama_from_toml(config)
    else:
        cfg, cls = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                               num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                               head_dim=128, max_position_embeddings=4096, rope_theta=1e6,
                               rms_norm_eps=1e-6, tie_word_embeddings=True), Qwen3ForCausalLM
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device("cuda"):
        m = cls(cfg).to(torch.bfloat16)
    m.eval()
    m.generation_config.pad_token_id = 0
    m.generation_config.eos_token_id = None
    return m


def timed(fn, reps):
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2]


def run(m, mode, B, P, N, reps):
    g = torch.Generator(device="cuda").manual_seed(B)
    ids = torch.randint(0, m.config.vocab_size, (B, P), device="cuda", generator=g)
    mask = torch.ones_like(ids)
    kw = dict(do_sample=False, attention_mask=mask, pad_token_id=0)
    if mode == "static_compile":  # generate compiles the decode forward for a static cache
        from transformers import CompileConfig
        kw["cache_implementation"] = "static"
        kw["compile_config"] = CompileConfig(fullgraph=True, mode="reduce-overhead")

    def gen(n):
        with torch.inference_mode():
            return m.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)

    out = gen(N)  # warm-up (and compilation)
    assert out.shape[1] == P + N, out.shape
    gen(1)
    t1 = timed(lambda: gen(1), reps)
    tn = timed(lambda: gen(N), reps)
    return {"impl": "transformers", "mode": mode, "batch": B, "prompt": P, "new": N,
            "ttft_ms": t1 * 1e3, "decode_tok_s": B * (N - 1) / (tn - t1),
            "total_s": tn}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--modes", nargs="+", default=["eager", "static_compile"])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--arch", choices=["qwen3", "gpt2"], default="qwen3")
    ap.add_argument("--config", help="a llama-arch ctrain config whose shape to build")
    a = ap.parse_args()
    import transformers
    print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__,
                      "gpu": torch.cuda.get_device_name()}), flush=True)
    m = build(0, a.arch, a.config)
    for mode in a.modes:
        for B in a.batch:
            try:
                print(json.dumps(run(m, mode, B, a.prompt, a.new, a.reps)), flush=True)
            except Exception as e:  # compile failures: report and go on
                print(json.dumps({"impl": "transformers", "mode": mode, "batch": B,
                                  "error": repr(e)[:300]}), flush=True)


if __name__ == "__main__":
    sys.exit(main())

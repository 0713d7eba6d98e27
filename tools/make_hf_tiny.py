#!/usr/bin/env python3
"""Tiny random Hugging Face checkpoints for ctrain's import-hf / export-hf tests.

Regenerate with:

    pip install torch transformers tokenizers safetensors
    python3 tools/make_hf_tiny.py --out tests/fixtures/hf

This writes one directory per model under tests/fixtures/hf/<name>/, each saved with
save_pretrained (safetensors) plus expected.json:

  gpt2        GPT2LMHeadModel, tied head, gelu_new, float32, single file, with a byte-level
              BPE tokenizer.json trained here on a fixed text (its size sets the vocabulary)
  llama_gqa   LlamaForCausalLM, GQA (4 query / 2 kv heads), tied head, saved in bfloat16
  qwen3       Qwen3ForCausalLM, q/k RMSNorm, head_dim 32 (n_head * head_dim != hidden), GQA,
              untied head, float32, single file
  qwen2       Qwen2ForCausalLM, q/k/v bias, rope_theta 1e6, untied head, float32, sharded
              (save_pretrained max_shard_size small: model.safetensors.index.json + shards)

All: 2 layers, hidden 64, vocabularies of 300-500 (not multiples of 64, so ctrain's padded
embedding rows are exercised), max positions 64. After the Transformers init (fixed seed,
initializer_range 0.1 so that logits are far from flat) every norm weight becomes
1 + 0.1*randn and every bias 0.02*randn, so a wrong mapping of any of them shows.

expected.json: {"name", "architecture", "dtype", "input_ids" (16 ints, int32 range),
"vocab_size", "logits" (16 x vocab_size floats, row-major, float32 printed exactly),
"greedy" (20 ids), "min_greedy_margin", "seed", "torch_version", "transformers_version"}.
Logits come from the float32 model with eager attention. For the bfloat16 model the weights
are rounded to bfloat16 first and the reference runs in float32 on those rounded weights, so
the numbers are what an exact bf16 -> fp32 import must reproduce. "greedy" is
model.generate(do_sample=False, max_new_tokens=20) with no eos (it never stops early); the
seed is chosen so that the top-1 / top-2 logit gap stays >= 1e-3 at every greedy step
(min_greedy_margin), so float rounding differences cannot flip a token.

    python3 tools/make_hf_tiny.py --verify-export DIR --expected tests/fixtures/hf/X/expected.json

loads a directory written by `ctrain export-hf` with Transformers and checks its logits
against an expected.json (a manual interop check; prints the normalized error).
"""

import argparse
import json
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                          LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

T_IN = 16
N_NEW = 20
MIN_MARGIN = 1e-3

CORPUS = (
    "The quick brown fox jumps over the lazy dog. A tiny model learns nothing, but its "
    "numbers must match exactly: logits, greedy tokens, every weight after a round trip. "
    "Hugging Face checkpoints store tensors by name in safetensors files; ctrain keeps one "
    "flat buffer with a table of names, shapes and offsets. Fused projections are rows of "
    "the query, key and value weights; gate and up projections are fused the same way. "
) * 4


def rope_kw(cls, theta):
    import inspect
    if "rope_parameters" in inspect.signature(cls.__init__).parameters:  # transformers >= 5
        return {"rope_parameters": {"rope_type": "default", "rope_theta": theta}}
    return {"rope_theta": theta, "rope_scaling": None}


def make_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([CORPUS], trainer=trainer)
    return tok


def build(name, tok):
    common = dict(initializer_range=0.1, bos_token_id=None, eos_token_id=None,
                  pad_token_id=None)
    if name == "gpt2":
        cfg = GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=64, n_embd=64, n_layer=2,
                         n_head=4, activation_function="gelu_new", resid_pdrop=0.0,
                         embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5, **common)
        return GPT2LMHeadModel._from_config(cfg, attn_implementation="eager"), "float32"
    llama_common = dict(hidden_size=64, num_hidden_layers=2, max_position_embeddings=64,
                        attention_dropout=0.0, hidden_act="silu", **common)
    if name == "llama_gqa":
        cfg = LlamaConfig(vocab_size=389, intermediate_size=176, num_attention_heads=4,
                          num_key_value_heads=2, rms_norm_eps=1e-5, tie_word_embeddings=True,
                          attention_bias=False, mlp_bias=False,
                          **rope_kw(LlamaConfig, 10000.0), **llama_common)
        return LlamaForCausalLM._from_config(cfg, attn_implementation="eager"), "bfloat16"
    if name == "qwen3":
        cfg = Qwen3Config(vocab_size=450, intermediate_size=96, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
                          tie_word_embeddings=False, attention_bias=False,
                          use_sliding_window=False, sliding_window=None,
                          **rope_kw(Qwen3Config, 10000.0), **llama_common)
        return Qwen3ForCausalLM._from_config(cfg, attn_implementation="eager"), "float32"
    if name == "qwen2":
        cfg = Qwen2Config(vocab_size=333, intermediate_size=128, num_attention_heads=4,
                          num_key_value_heads=1, rms_norm_eps=1e-6, tie_word_embeddings=False,
                          use_sliding_window=False, sliding_window=None,
                          **rope_kw(Qwen2Config, 1000000.0), **llama_common)
        return Qwen2ForCausalLM._from_config(cfg, attn_implementation="eager"), "float32"
    raise ValueError(name)


def perturb(model):
    """Norm weights -> 1 + 0.1*randn, biases -> 0.02*randn (HF inits them to 1 and 0)."""
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname or ".ln_" in pname:
                if pname.endswith("weight"):
                    p.copy_(1.0 + 0.1 * torch.randn_like(p))
                else:
                    p.copy_(0.02 * torch.randn_like(p))
            elif pname.endswith(".bias"):
                p.copy_(0.02 * torch.randn_like(p))


def greedy_reference(model, ids):
    """HF generate plus the smallest top-1/top-2 gap seen along the way."""
    gen = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         do_sample=False, max_new_tokens=N_NEW, min_new_tokens=N_NEW,
                         eos_token_id=None, pad_token_id=0, output_scores=True,
                         return_dict_in_generate=True)
    new = gen.sequences[0, len(ids):].tolist()
    margin = min(float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in gen.scores)
    # the same continuation by full recompute (no KV cache), as ctrain's generate does it
    seq = list(ids)
    for _ in range(N_NEW):
        seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    assert seq[len(ids):] == new, "generate and full-recompute greedy disagree"
    return new, margin


def make_one(name, out_root, tok):
    out = os.path.join(out_root, name)
    for seed in range(1000, 1100):
        torch.manual_seed(seed)
        model, dtype = build(name, tok)
        model = model.float().eval()
        perturb(model)
        if dtype == "bfloat16":  # the reference runs on the rounded weights, in float32
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(p.to(torch.bfloat16).to(torch.float32))
        V = model.config.vocab_size
        if name == "gpt2":
            ids = tok.encode("Hugging Face checkpoints store tensors by name").ids
            ids = (ids + ids)[:T_IN]
        else:
            ids = torch.randint(0, V, (T_IN,), generator=torch.Generator().manual_seed(seed)).tolist()
        assert len(ids) == T_IN
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
            greedy, margin = greedy_reference(model, ids)
        if margin >= MIN_MARGIN and len(greedy) == N_NEW:
            break
        print(f"{name}: seed {seed}: greedy margin {margin:.2e} too small, next seed")
    else:
        raise SystemExit(f"{name}: no seed with a greedy margin >= {MIN_MARGIN}")

    if os.path.isdir(out):
        shutil.rmtree(out)
    save = model.to(torch.bfloat16) if dtype == "bfloat16" else model
    kw = {"max_shard_size": "60KB"} if name == "qwen2" else {}
    save.save_pretrained(out, safe_serialization=True, **kw)
    if name == "gpt2":
        tok.save(os.path.join(out, "tokenizer.json"))
    gen_cfg = os.path.join(out, "generation_config.json")
    if os.path.exists(gen_cfg):
        os.remove(gen_cfg)  # not read by ctrain; keeps the fixtures small and stable

    expected = dict(
        name=name, architecture=type(model).__name__, dtype=dtype, input_ids=ids,
        vocab_size=V, logits=[float(x) for x in logits.numpy().astype(np.float32).reshape(-1)],
        greedy=greedy, min_greedy_margin=margin, seed=seed,
        torch_version=torch.__version__, transformers_version=transformers.__version__)
    with open(os.path.join(out, "expected.json"), "w") as f:
        # repr of a float32 value widened to double prints it exactly (round-trips via strtod)
        json.dump(expected, f, separators=(",", ":"))
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(out, x)) for x in os.listdir(out))
    print(f"{out}: {type(model).__name__} V={V} seed={seed} dtype={dtype} greedy margin "
          f"{margin:.3e}, files {sorted(os.listdir(out))}, {size} bytes")


def verify_export(path, expected_path):
    with open(expected_path) as f:
        exp = json.load(f)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager",
                                                 dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([exp["input_ids"]])).logits[0].float().numpy()
    ref = np.array(exp["logits"], dtype=np.float32).reshape(len(exp["input_ids"]), -1)
    err = float(np.abs(logits - ref).max() / np.abs(ref).max())
    print(f"{path}: {type(model).__name__}: normalized logits error {err:.3e}")
    if err > 1e-4:
        raise SystemExit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures/hf")
    ap.add_argument("--only", choices=["gpt2", "llama_gqa", "qwen3", "qwen2"])
    ap.add_argument("--verify-export", metavar="DIR")
    ap.add_argument("--expected", metavar="JSON")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.verify_export:
        verify_export(args.verify_export, args.expected)
        return
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}")
    os.makedirs(args.out, exist_ok=True)
    tok = make_tokenizer()
    for name in ([args.only] if args.only else ["gpt2", "llama_gqa", "qwen3", "qwen2"]):
        make_one(name, args.out, tok)


if __name__ == "__main__":
    main()

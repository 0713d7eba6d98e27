#!/usr/bin/env python3
"""Generate the golden HDF5 fixtures that ctrain's C tests compare against.

Regenerate with:

    pip install torch transformers h5py
    python3 tools/make_golden.py --out tests/fixtures

This writes tests/fixtures/golden_gpt2.h5 and tests/fixtures/golden_llama.h5.
Everything is float32 on the CPU, with eager attention and no dropout, so the
results are deterministic for a given torch/transformers version (the versions
used are printed and stored as root attributes "torch_version" and
"transformers_version").

Models (Hugging Face Transformers, float32):
  gpt2  : GPT2LMHeadModel, V=256, maxT=32, C=64, L=2, H=4, gelu_new, tied wte.
  llama : Qwen3ForCausalLM (Llama with per-head q/k RMSNorm and GQA), V=256,
          C=64, F=96, L=2, H=4, KV=2, hd=16, rope_theta=1e4, untied lm_head.
After the HF init (torch.manual_seed fixed) every norm weight becomes
1 + 0.1*randn and every norm/linear bias 0.02*randn, so their gradients are
non-trivial. Batch: B=4, T=32, inputs and targets uniform in [0, 256).
loss = F.cross_entropy(logits.view(-1, V), targets.view(-1)) (mean over B*T;
no label shifting).

File layout (float32 unless noted):
  root attributes: arch, n_layer, n_head, n_kv_head, d_model, head_dim, d_ff,
    vocab_size, max_seq_len, rope_theta, norm_eps, qk_norm, tie_embeddings,
    attn_bias, B, T, lr, beta1, beta2, eps, weight_decay, grad_clip,
    adamw_steps, seed, torch_version, transformers_version
    (ints int64, floats float64, strings variable-length UTF-8)
  /inputs (B,T) int32, /targets (B,T) int32
  /params/<name>  initial parameters, ctrain names and layout
  /grads/<name>   d(mean loss)/d(param), same names and layout
  /logits (B,T,V), /loss (1,)
  /adamw_losses (5,), /adamw_grad_norms (5,): 5 AdamW steps on the same batch
    from the initial weights (lr 1e-3, betas (0.9, 0.95), eps 1e-8,
    weight_decay 0.1 for ndim>=2 params and 0 otherwise, clip_grad_norm_ 1.0;
    the loss is the one computed before each update, the norm is the pre-clip
    total norm returned by clip_grad_norm_).

ctrain layout: linear weights are (out_features, in_features) like nn.Linear
(HF GPT-2's Conv1D weights are (in, out) and are transposed here); fused
weights are concatenations along dim 0 (c_attn rows = q|k|v as in HF,
qkv_proj = cat(q_proj, k_proj, v_proj), gate_up_proj = cat(gate_proj, up_proj)).

The script also re-implements both forward passes from the ctrain-layout
tensors alone (reference_forward_*) and asserts that they reproduce the HF
logits: this pins the layout and conventions (e.g. RoPE rotate-half pairing
of dims i and i + hd/2, RMSNorm as w * x / sqrt(mean(x^2) + eps)).
"""

import argparse
import inspect
import math
import os
import sys
from collections import Counter

import h5py
import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, Qwen3Config, Qwen3ForCausalLM

SEED = 1234
B, T = 4, 32
V = 256
ADAMW = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1,
             grad_clip=1.0, adamw_steps=5)


# ----------------------------------------------------------------------------
# model construction

def build_gpt2():
    cfg = GPT2Config(vocab_size=V, n_positions=32, n_embd=64, n_layer=2, n_head=4,
                     activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0, layer_norm_epsilon=1e-5,
                     bos_token_id=None, eos_token_id=None)
    model = GPT2LMHeadModel._from_config(cfg, attn_implementation="eager")
    assert model.config._attn_implementation == "eager"
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight is model.transformer.wte.weight
    assert not getattr(cfg, "scale_attn_by_inverse_layer_idx", False)
    assert not getattr(cfg, "reorder_and_upcast_attn", False)
    C = cfg.n_embd
    attrs = dict(arch="gpt2", n_layer=cfg.n_layer, n_head=cfg.n_head, n_kv_head=cfg.n_head,
                 d_model=C, head_dim=C // cfg.n_head, d_ff=4 * C, vocab_size=V,
                 max_seq_len=cfg.n_positions, rope_theta=0.0,
                 norm_eps=cfg.layer_norm_epsilon, qk_norm=0, tie_embeddings=1, attn_bias=1)
    return model, attrs


def build_llama():
    kw = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
              attention_bias=False, attention_dropout=0.0, hidden_act="silu",
              use_sliding_window=False, sliding_window=None)
    params = inspect.signature(Qwen3Config.__init__).parameters
    if "rope_parameters" in params:  # transformers >= 5
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    else:
        kw["rope_theta"] = 10000.0
        kw["rope_scaling"] = None
    cfg = Qwen3Config(**kw)
    model = Qwen3ForCausalLM._from_config(cfg, attn_implementation="eager")
    assert model.config._attn_implementation == "eager"
    # no sliding window, no rope scaling
    assert not cfg.use_sliding_window
    assert getattr(cfg, "sliding_window", None) is None
    lt = getattr(cfg, "layer_types", None)
    assert lt is None or all(t == "full_attention" for t in lt), lt
    rp = getattr(cfg, "rope_parameters", None)
    if rp is not None:
        assert rp.get("rope_type", "default") == "default", rp
        assert set(rp) <= {"rope_type", "rope_theta"}, rp
        theta = float(rp["rope_theta"])
    else:
        assert getattr(cfg, "rope_scaling", None) is None
        theta = float(cfg.rope_theta)
    assert theta == 10000.0
    for layer in model.model.layers:
        assert getattr(layer.self_attn, "sliding_window", None) is None
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    attrs = dict(arch="llama", n_layer=cfg.num_hidden_layers, n_head=cfg.num_attention_heads,
                 n_kv_head=cfg.num_key_value_heads, d_model=cfg.hidden_size,
                 head_dim=cfg.head_dim, d_ff=cfg.intermediate_size, vocab_size=V,
                 max_seq_len=cfg.max_position_embeddings, rope_theta=theta,
                 norm_eps=cfg.rms_norm_eps, qk_norm=1, tie_embeddings=0, attn_bias=0)
    return model, attrs


def perturb(model):
    """Norm weights -> 1 + 0.1*randn, norm biases and linear biases -> 0.02*randn."""
    norm_params = set()
    with torch.no_grad():
        for _, mod in model.named_modules():
            if "norm" in type(mod).__name__.lower():
                for pname, p in mod.named_parameters(recurse=False):
                    norm_params.add(id(p))
                    if pname == "weight":
                        p.copy_(1.0 + 0.1 * torch.randn_like(p))
                    elif pname == "bias":
                        p.copy_(0.02 * torch.randn_like(p))
                    else:
                        raise AssertionError(f"unexpected norm parameter {pname}")
        for name, p in model.named_parameters():
            if name.endswith(".bias") and id(p) not in norm_params:
                p.copy_(0.02 * torch.randn_like(p))


# ----------------------------------------------------------------------------
# HF -> ctrain name/layout mapping.  Each entry: ctrain name -> (hf names, fn)
# where fn turns the list of HF tensors into the ctrain tensor.

def _ident(ts):
    return ts[0]


def _transpose(ts):
    return ts[0].t()


def _cat0(ts):
    return torch.cat(ts, dim=0)


def mapping_gpt2(n_layer):
    m = {"wte": (["transformer.wte.weight"], _ident),
         "wpe": (["transformer.wpe.weight"], _ident)}
    for i in range(n_layer):
        p, q = f"transformer.h.{i}.", f"h.{i}."
        for ln in ("ln_1", "ln_2"):
            for s in ("weight", "bias"):
                m[f"{q}{ln}.{s}"] = ([f"{p}{ln}.{s}"], _ident)
        for lin in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
            m[f"{q}{lin}.weight"] = ([f"{p}{lin}.weight"], _transpose)  # Conv1D (in,out)
            m[f"{q}{lin}.bias"] = ([f"{p}{lin}.bias"], _ident)
    for s in ("weight", "bias"):
        m[f"ln_f.{s}"] = ([f"transformer.ln_f.{s}"], _ident)
    return m


def mapping_llama(n_layer, tied):
    m = {"embed_tokens": (["model.embed_tokens.weight"], _ident)}
    for i in range(n_layer):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        m[f"{q}input_layernorm.weight"] = ([f"{p}input_layernorm.weight"], _ident)
        m[f"{q}self_attn.qkv_proj.weight"] = (
            [f"{p}self_attn.q_proj.weight", f"{p}self_attn.k_proj.weight",
             f"{p}self_attn.v_proj.weight"], _cat0)
        m[f"{q}self_attn.q_norm.weight"] = ([f"{p}self_attn.q_norm.weight"], _ident)
        m[f"{q}self_attn.k_norm.weight"] = ([f"{p}self_attn.k_norm.weight"], _ident)
        m[f"{q}self_attn.o_proj.weight"] = ([f"{p}self_attn.o_proj.weight"], _ident)
        m[f"{q}post_attention_layernorm.weight"] = ([f"{p}post_attention_layernorm.weight"], _ident)
        m[f"{q}mlp.gate_up_proj.weight"] = (
            [f"{p}mlp.gate_proj.weight", f"{p}mlp.up_proj.weight"], _cat0)
        m[f"{q}mlp.down_proj.weight"] = ([f"{p}mlp.down_proj.weight"], _ident)
    m["norm.weight"] = (["model.norm.weight"], _ident)
    if not tied:
        m["lm_head"] = (["lm_head.weight"], _ident)
    return m


def check_mapping(model, mapping):
    hf = dict(model.named_parameters())  # deduplicated: a tied lm_head is not listed
    used = Counter(n for names, _ in mapping.values() for n in names)
    dup = [n for n, c in used.items() if c != 1]
    missing = sorted(set(hf) - set(used))
    unknown = sorted(set(used) - set(hf))
    assert not dup, f"HF params mapped more than once: {dup}"
    assert not missing, f"HF params not mapped: {missing}"
    assert not unknown, f"mapping names unknown HF params: {unknown}"
    assert sum(used.values()) == len(hf)


def to_ctrain(model, mapping, grads=False):
    hf = dict(model.named_parameters())
    out = {}
    for cname, (names, fn) in mapping.items():
        ts = [(hf[n].grad if grads else hf[n]).detach() for n in names]
        assert all(t is not None for t in ts), cname
        out[cname] = fn(ts).contiguous().to(torch.float32).clone()
    return out


# ----------------------------------------------------------------------------
# independent reference forward from ctrain-layout tensors (layout check)

def _causal_attention(q, k, v):
    # q: (B,H,T,hd), k/v: (B,H,T,hd)
    hd = q.shape[-1]
    Tq = q.shape[2]
    att = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
    mask = torch.ones(Tq, Tq, dtype=torch.bool).tril()
    att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return att @ v


def reference_forward_gpt2(P, a, idx):
    Bn, Tn = idx.shape
    C, H, hd, eps = a["d_model"], a["n_head"], a["head_dim"], a["norm_eps"]

    def ln(x, pre):
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + eps) * P[pre + ".weight"] + P[pre + ".bias"]

    def lin(x, pre):
        return x @ P[pre + ".weight"].t() + P[pre + ".bias"]

    x = P["wte"][idx] + P["wpe"][:Tn]
    for i in range(a["n_layer"]):
        h = ln(x, f"h.{i}.ln_1")
        qkv = lin(h, f"h.{i}.attn.c_attn")
        q, k, v = (t.view(Bn, Tn, H, hd).transpose(1, 2) for t in qkv.split(C, dim=-1))
        y = _causal_attention(q, k, v).transpose(1, 2).reshape(Bn, Tn, C)
        x = x + lin(y, f"h.{i}.attn.c_proj")
        h = ln(x, f"h.{i}.ln_2")
        h = lin(h, f"h.{i}.mlp.c_fc")
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3)))
        x = x + lin(h, f"h.{i}.mlp.c_proj")
    x = ln(x, "ln_f")
    return x @ P["wte"].t()


def reference_forward_llama(P, a, idx):
    Bn, Tn = idx.shape
    C, H, KV, hd, Fd = a["d_model"], a["n_head"], a["n_kv_head"], a["head_dim"], a["d_ff"]
    eps, theta = a["norm_eps"], a["rope_theta"]

    def rms(x, w):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w

    # RoPE, rotate-half convention: dim j pairs with dim j + hd/2, frequency theta^(-2j/hd)
    half = hd // 2
    inv_freq = theta ** (-torch.arange(0, half, dtype=torch.float64) * 2.0 / hd)
    ang = torch.arange(Tn, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (T, half)
    cos, sin = ang.cos().float(), ang.sin().float()

    def rope(x):  # (B,h,T,hd)
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    x = P["embed_tokens"][idx]
    for i in range(a["n_layer"]):
        p = f"layers.{i}."
        h = rms(x, P[p + "input_layernorm.weight"])
        qkv = h @ P[p + "self_attn.qkv_proj.weight"].t()
        q, k, v = qkv.split([H * hd, KV * hd, KV * hd], dim=-1)
        q = rms(q.view(Bn, Tn, H, hd), P[p + "self_attn.q_norm.weight"]).transpose(1, 2)
        k = rms(k.view(Bn, Tn, KV, hd), P[p + "self_attn.k_norm.weight"]).transpose(1, 2)
        v = v.view(Bn, Tn, KV, hd).transpose(1, 2)
        q, k = rope(q), rope(k)
        rep = H // KV  # query head j uses kv head j // rep
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        y = _causal_attention(q, k, v).transpose(1, 2).reshape(Bn, Tn, H * hd)
        x = x + y @ P[p + "self_attn.o_proj.weight"].t()
        h = rms(x, P[p + "post_attention_layernorm.weight"])
        g, u = (h @ P[p + "mlp.gate_up_proj.weight"].t()).split(Fd, dim=-1)
        x = x + (F.silu(g) * u) @ P[p + "mlp.down_proj.weight"].t()
    x = rms(x, P["norm.weight"])
    return x @ P["lm_head"].t()


# ----------------------------------------------------------------------------

def loss_fn(model, inputs, targets):
    logits = model(input_ids=inputs.long()).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.long().reshape(-1))
    return logits, loss


def make_one(arch, out_dir):
    torch.manual_seed(SEED)
    if arch == "gpt2":
        model, attrs = build_gpt2()
        mapping = mapping_gpt2(attrs["n_layer"])
        ref_fwd = reference_forward_gpt2
    else:
        model, attrs = build_llama()
        mapping = mapping_llama(attrs["n_layer"], tied=False)
        ref_fwd = reference_forward_llama
    model = model.float().cpu()
    model.train()  # dropout probabilities are all 0
    check_mapping(model, mapping)
    perturb(model)
    inputs = torch.randint(0, V, (B, T), dtype=torch.int32)
    targets = torch.randint(0, V, (B, T), dtype=torch.int32)

    init_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    params0 = to_ctrain(model, mapping)
    for name, t in params0.items():
        assert t.dtype == torch.float32, name

    # golden forward/backward
    model.zero_grad(set_to_none=True)
    logits, loss = loss_fn(model, inputs, targets)
    loss.backward()
    grads = to_ctrain(model, mapping, grads=True)
    for name in params0:
        assert grads[name].shape == params0[name].shape, name
        assert grads[name].abs().max() > 0, f"zero gradient for {name}"

    # layout check: independent forward from ctrain tensors matches HF
    with torch.no_grad():
        ref = ref_fwd(params0, attrs, inputs.long())
    err = (ref - logits.detach()).abs().max().item()
    scale = logits.detach().abs().max().item()
    assert err <= 1e-5 * max(1.0, scale), f"{arch}: reference forward mismatch {err}"

    # AdamW run from the same initial weights
    model.load_state_dict(init_state)
    model.zero_grad(set_to_none=True)
    for k, v in model.state_dict().items():
        assert torch.equal(v, init_state[k]), k
    params = list(model.parameters())  # deduplicated (tied wte counted once)
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": ADAMW["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"],
        foreach=False, fused=False)
    adamw_losses, adamw_norms = [], []
    for _ in range(ADAMW["adamw_steps"]):
        opt.zero_grad(set_to_none=True)
        _, l = loss_fn(model, inputs, targets)
        l.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, ADAMW["grad_clip"])
        opt.step()
        adamw_losses.append(l.item())
        adamw_norms.append(norm.item())
    assert adamw_losses[0] == loss.item(), (adamw_losses[0], loss.item())

    path = os.path.join(out_dir, f"golden_{arch}.h5")
    with h5py.File(path, "w") as f:
        root_attrs = dict(attrs)
        root_attrs.update(B=B, T=T, seed=SEED, **ADAMW)
        for k, v in root_attrs.items():
            if isinstance(v, str):
                f.attrs.create(k, str(v), dtype=h5py.string_dtype("utf-8"))
            elif isinstance(v, (bool, int, np.integer)):
                f.attrs[k] = np.int64(v)
            else:
                f.attrs[k] = np.float64(v)
        for k, v in (("torch_version", torch.__version__),
                     ("transformers_version", transformers.__version__)):
            f.attrs.create(k, str(v), dtype=h5py.string_dtype("utf-8"))
        f.create_dataset("inputs", data=inputs.numpy().astype(np.int32))
        f.create_dataset("targets", data=targets.numpy().astype(np.int32))
        gp = f.create_group("params")
        gg = f.create_group("grads")
        for name in params0:
            gp.create_dataset(name, data=params0[name].numpy().astype(np.float32))
            gg.create_dataset(name, data=grads[name].numpy().astype(np.float32))
        f.create_dataset("logits", data=logits.detach().numpy().astype(np.float32))
        f.create_dataset("loss", data=np.array([loss.item()], dtype=np.float32))
        f.create_dataset("adamw_losses", data=np.array(adamw_losses, dtype=np.float32))
        f.create_dataset("adamw_grad_norms", data=np.array(adamw_norms, dtype=np.float32))

    n_params = sum(t.numel() for t in params0.values())
    print(f"{path}: {len(params0)} tensors, {n_params} params, logits {tuple(logits.shape)}, "
          f"loss {loss.item():.6f}, ref-forward max err {err:.2e}, {os.path.getsize(path)} bytes")
    print(f"  adamw_losses     {[round(x, 6) for x in adamw_losses]}")
    print(f"  adamw_grad_norms {[round(x, 6) for x in adamw_norms]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures", help="output directory")
    ap.add_argument("--arch", choices=["gpt2", "llama", "all"], default="all")
    args = ap.parse_args()
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, h5py {h5py.__version__}, "
          f"numpy {np.__version__}")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.out, exist_ok=True)
    for arch in (["gpt2", "llama"] if args.arch == "all" else [args.arch]):
        make_one(arch, args.out)


if __name__ == "__main__":
    main()

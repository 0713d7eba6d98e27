#!/usr/bin/env python3
"""PyTorch side of bench/attention.sh: causal SDPA forward and forward+backward times for the
same B, H, KV, T, D shapes as ctrain's test_ops_cuda bench cases, bf16, with the flash and the
cuDNN backends (torch.nn.attention.sdpa_kernel). Median of --iters runs after --warmup, CUDA
events. FLOPs as ctrain counts them: forward 2*B*H*T*T*D (causal half of 4*B*H*T*T*D),
backward twice that. One JSON line per shape and backend on stdout.
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [(16, 1024, 16, 16, 64), (16, 1024, 16, 8, 128), (8, 2048, 16, 16, 64), (8, 2048, 16, 8, 128),
          (4, 4096, 16, 16, 64), (4, 4096, 16, 8, 128), (2, 8192, 16, 16, 64), (2, 8192, 16, 8, 128)]


def timed(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    for B, T, H, KV, D in SHAPES:
        q = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(B, KV, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(B, KV, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        do = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
        fl = 2.0 * B * H * T * T * D
        for name, be in backends.items():
            try:
                with sdpa_kernel(be):
                    def fwd():
                        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=KV != H)

                    def fwd_bwd():
                        o = fwd()
                        torch.autograd.grad(o, (q, k, v), do)

                    tf = timed(fwd, a.warmup, a.iters)
                    tfb = timed(fwd_bwd, a.warmup, a.iters)
            except RuntimeError as e:  # backend not available for this shape (e.g. GQA on flash)
                print(json.dumps({"impl": "torch-" + name, "B": B, "T": T, "H": H, "KV": KV, "D": D,
                                  "error": str(e).splitlines()[0][:160]}))
                continue
            print(json.dumps({"impl": "torch-" + name, "B": B, "T": T, "H": H, "KV": KV, "D": D,
                              "fwd_us": round(tf * 1e6, 1), "fwd_bwd_us": round(tfb * 1e6, 1),
                              "fwd_tflops": round(fl / tf / 1e12, 1),
                              "fwd_bwd_tflops": round(3 * fl / tfb / 1e12, 1)}), flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""PyTorch side of the multi-GPU benchmark (bench/gpu_dist.sh), run under torchrun.

Same model as ctrain (HF Transformers GPT2LMHeadModel, dropout 0, sdpa attention, tied head),
random tokens, AdamW (lr 3e-4, wd 0.1 on 2-D params, betas 0.9/0.95), global-norm clipping 1.0,
bf16 autocast with fp32 master weights. Modes:
  ddp    torch.nn.parallel.DistributedDataParallel (bucket_cap_mb 25) around torch.compile
  fsdp2  torch.distributed.fsdp.fully_shard on every block and the root (FSDP2), bf16 params
         for compute (MixedPrecisionPolicy param_dtype bf16, reduce_dtype fp32), compiled blocks
  single one GPU, no wrapper (torch.compile), for the scaling baseline
Times --steps steps after --warmup (cuda synchronize around each); rank 0 prints one JSON line:
tokens/s over all ranks, peak memory per GPU (torch.cuda.max_memory_allocated / reserved).

    torchrun --standalone --nproc_per_node 2 bench/torch_dist_ref.py --mode ddp --micro_batch 64
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["ddp", "fsdp2", "single"], required=True)
    ap.add_argument("--n_layer", type=int, default=12)
    ap.add_argument("--d_model", type=int, default=768)
    ap.add_argument("--n_head", type=int, default=12)
    ap.add_argument("--vocab_size", type=int, default=50257)
    ap.add_argument("--seq_len", type=int, default=1024)
    ap.add_argument("--micro_batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--no_compile", action="store_true")
    a = ap.parse_args()

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import transformers

    real_stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        dist_on = a.mode != "single"
        if dist_on:
            dist.init_process_group("nccl")
        rank = dist.get_rank() if dist_on else 0
        world = dist.get_world_size() if dist_on else 1
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        torch.manual_seed(0)
        cfg = transformers.GPT2Config(
            vocab_size=a.vocab_size, n_positions=a.seq_len, n_embd=a.d_model, n_layer=a.n_layer,
            n_head=a.n_head, activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, tie_word_embeddings=True, use_cache=False)
        cfg._attn_implementation = "sdpa"
        model = transformers.GPT2LMHeadModel(cfg).to(dev)
        compile_ = not a.no_compile
        if a.mode == "fsdp2":
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            for block in model.transformer.h:
                if compile_:
                    block.compile()
                fully_shard(block, mp_policy=mp)
            fully_shard(model, mp_policy=mp)
            net = model
        else:
            net = torch.compile(model) if compile_ else model
            if a.mode == "ddp":
                net = torch.nn.parallel.DistributedDataParallel(net, device_ids=[local],
                                                                bucket_cap_mb=25)
        decay = [p for p in model.parameters() if p.dim() >= 2]
        other = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": other, "weight_decay": 0.0}],
                                lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                                fused=a.mode != "fsdp2")  # FSDP2's DTensors: foreach
        B, T = a.micro_batch, a.seq_len
        g = torch.Generator(device=dev).manual_seed(1234 + rank)
        use_autocast = a.mode != "fsdp2"  # FSDP2 casts parameters itself (param_dtype bf16)

        def step():
            x = torch.randint(0, a.vocab_size, (B, T + 1), device=dev, generator=g)
            ctx = torch.autocast("cuda", dtype=torch.bfloat16) if use_autocast else contextlib.nullcontext()
            with ctx:
                logits = net(input_ids=x[:, :-1]).logits
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), x[:, 1:].reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        times = []
        for i in range(a.warmup + a.steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            if i >= a.warmup:
                times.append(time.perf_counter() - t0)
        dt = statistics.median(times)
        peak = torch.cuda.max_memory_allocated(dev) / 2**20
        reserved = torch.cuda.max_memory_reserved(dev) / 2**20
        if dist_on:
            t = torch.tensor([dt, peak, reserved], device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            dt, peak, reserved = t.tolist()
            dist.destroy_process_group()
    if rank == 0:
        print(json.dumps({"impl": "torch", "mode": a.mode, "compile": compile_, "gpus": world,
                          "micro_batch": B, "seq_len": T, "step_s": dt,
                          "tokens_per_s": B * T * world / dt, "peak_alloc_mib": round(peak),
                          "peak_reserved_mib": round(reserved), "torch": torch.__version__}),
              file=real_stdout)


if __name__ == "__main__":
    main()

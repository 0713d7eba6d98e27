#!/usr/bin/env bash
# bench/gpu_scale.sh — scaling runs on 4 and 8 GPUs (issues #10 and #11; gpu_dist.sh is the
# 2-GPU version). NPROC = GPUs to use (default: all that nvidia-smi lists). Parts:
#   bench  GPT-2 124M, bf16, micro-batch 64 per GPU (smaller only when 64 does not fit: said so),
#          T=1024: 1 GPU, then NPROC GPUs with ddp, zero1, zero2, zero3 (+ tp=2 x dp=2 and tp=4 at
#          4 GPUs): tokens/s, scaling efficiency against the 1-GPU run of the same part, peak
#          memory per GPU next to ctrain's estimate; the issue's targets checked at the end
#   torch  ctrain 1 GPU and ddp, then PyTorch (torch.compile) single, DDP and FSDP2 at NPROC via
#          torchrun (bench/torch_dist_ref.py) on the same shapes; ctrain ddp / torch ddp
#   qwen   Qwen3-0.6B shape (configs/qwen3-0.6b.toml, T=2048, micro-batch 8 per data-parallel
#          rank): 1 GPU, then zero3 and tp=4 (4 GPUs) / zero3, tp=2 x dp=4, tp=4 x dp=2, tp=8,
#          zero3 x tp=2 (8 GPUs): tokens/s, MFU, memory per GPU
#   big    Llama-3.1-8B shape (configs/llama-8b.toml, T=2048; does not fit one GPU in ddp): zero3
#          (= FSDP) and zero3 x tp=BIG_TP, micro-batch picked from `ctrain memory`: tokens/s per
#          GPU and MFU next to torchtitan's 5,762 / 6,667 tokens/s/GPU (8 x H100). Stopped with
#          SIGKILL after BIG_STEPS logged steps so that no ~96 GB checkpoint is written. Under
#          tensor parallelism every rank builds the whole fp32 model in host memory (train.c
#          full_host_model: its weights only, drawn in place, 4 B/param = ~30 GiB per rank for
#          8B): the tp run is skipped, saying so, when NPROC x that exceeds MemAvailable
#          (HOST_B_PER_PARAM overrides the rate, BIG_FORCE=1 tries anyway).
#   equiv  bf16 10-step losses of every mode and mesh at NPROC against 1 GPU with the same
#          global batch (grad_accum = data-parallel degree), <= 1e-2 relative; gpt2 and llama
#          (GQA, qk_norm) shapes; plus the NCCL collective test at all GPUs
#   fault  a worker killed (SIGKILL) and one frozen (SIGSTOP) are reported by the launcher within
#          parallel.timeout_s (+ grace); with --max_restarts=1 a killed run resumes from its last
#          checkpoint and completes
#   comm   all-reduce / reduce-scatter / all-gather time, algbw, busbw at NPROC ranks (comm_bench)
# usage: bench/gpu_scale.sh PART...   (default: all; ONE PART PER DEVICE CALL: each part checks a
#        time budget, PART_BUDGET = 540 s, and reports what it had to skip; fault + comm fit one)
#        x4: 5 calls (bench, torch, qwen, equiv, "fault comm"); x8: the same + big. Needs the CUDA
#        build in build-gpu (with bench/comm_bench and tests/test_comm_nccl) and, for torch,
#        torch + transformers; pass COMMIT (the device copy's HEAD can be stale).
# env:   NPROC, OUT (bench/results), COMMIT (else git), BUILD (build-gpu), PART_BUDGET, and per
#        part: BENCH_MODES, QWEN_MODES, EQUIV_MODES, QWEN_B, BIG_TP, BIG_B, BIG_STEPS, TORCH_B
#        DRY=1: the same parts with tiny shapes on the CPU build (build/, Gloo, CUDA hidden),
#        NPROC default 4, results under $OUT (default /tmp/gpu_scale_dry); torch is not run.
# Results: $OUT/gpu_scale_<part>_<date>_<NPROC>x<gpu>_<commit>.txt, header naming all three.
# Mode names (BENCH_MODES etc.): ddp zero1 zero2 zero3, tpT (tensor T, ddp over the rest),
# zeroK+tpT (ZeRO-K over the data-parallel rows of a T-wide tensor mesh).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export NCCL_NVLS_ENABLE=0
DRY=${DRY:-0}
if [ "$DRY" = 1 ]; then
  BUILD=${BUILD:-build}
  export CUDA_VISIBLE_DEVICES=
  NPROC=${NPROC:-4}
  gpu=CPU-dry
  : "${OUT:=${TMPDIR:-/tmp}/gpu_scale_dry}"
else
  BUILD=${BUILD:-build-gpu}
  export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  NPROC=${NPROC:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | sed 's/^NVIDIA //; s/[^A-Za-z0-9.-]/_/g')
  : "${OUT:=bench/results}"
fi
[ "${NPROC:-0}" -ge 2 ] 2>/dev/null || { echo "gpu_scale.sh: NPROC = '${NPROC:-}': need at least 2 GPUs"; exit 2; }
CT=$BUILD/ctrain
LAUNCH=$BUILD/ctrain-launch
PART_BUDGET=${PART_BUDGET:-540}
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
tag=$(date -u +%F)_${NPROC}x${gpu:-GPU}_${commit}
mkdir -p data "$OUT"
[ -f data/fortunes/train.h5 ] || timeout 120 "$CT" prepare --out-dir data/fortunes >/dev/null 2>&1 ||
  timeout 120 "$CT" prepare --out-dir data/fortunes /usr/lib/python3*/*.py >/dev/null 2>&1
TMP=$(mktemp -d)
SMI_PID=
trap '[ -n "$SMI_PID" ] && kill "$SMI_PID" 2>/dev/null; rm -rf "$TMP"' EXIT
DATA=(data.train=data/fortunes/train.h5 data.val= data.tokenizer=byte)

# ---- shapes (DRY: the same keys, tiny values; heads / kv heads kept so tp checks still bite) ----
GPT2=(configs/smoke.toml model.n_layer=12 model.d_model=768 model.n_head=12 model.vocab_size=50257
      model.max_seq_len=1024 train.seq_len=1024 train.max_steps=23 train.eval_every=0 data.val=
      train.sample_tokens=0 train.warmup_steps=5 train.lr=6e-4 train.precision=bf16
      train.checkpoint_every=0)
GPT2_B="64 48 32 16 8"
QWEN=(configs/qwen3-0.6b.toml "${DATA[@]}" train.grad_accum=1 train.max_steps=20 train.eval_every=0
      train.sample_tokens=0 train.checkpoint_every=0 train.warmup_steps=5 train.precision=bf16)
QWEN_B=${QWEN_B:-8}
BIG=(configs/llama-8b.toml "${DATA[@]}" train.grad_accum=1 train.eval_every=0 train.sample_tokens=0
     train.checkpoint_every=0 train.warmup_steps=5 train.precision=bf16)
BIG_STEPS=${BIG_STEPS:-13}
SMALL=(configs/smoke.toml model.n_layer=4 model.d_model=256 model.n_head=8 model.max_seq_len=256
       train.seq_len=256 train.micro_batch=8 train.max_steps=10 train.eval_every=0 data.val=
       train.sample_tokens=0 train.warmup_steps=2 train.precision=bf16)
# llama for equiv: GQA 2:1 with 8 kv heads, so that tp=8 divides them (head_dim 32)
LLAMA=(model.arch=llama model.d_model=512 model.n_head=16 model.n_kv_head=8 model.qk_norm=true
       model.tie_embeddings=false)
FAULT_STEPS=3000; FAULT_TIMEOUT=30; COMM=(--min_bytes 1048576 --max_bytes 1073741824 --iters 20 --warmup 5)
T_RUN=150; T_BIG=420
if [ "$DRY" = 1 ]; then
  GPT2+=(model.n_layer=2 model.d_model=64 model.n_head=4 model.vocab_size=512 model.max_seq_len=64
         train.seq_len=64 train.max_steps=12)
  GPT2_B="8 4"
  QWEN+=(model.n_layer=2 model.d_model=64 model.head_dim=8 model.d_ff=128 model.vocab_size=512
         model.max_seq_len=64 train.seq_len=64 train.max_steps=12)
  QWEN_B=${QWEN_B_DRY:-2}
  BIG+=(model.n_layer=2 model.d_model=128 model.head_dim=4 model.d_ff=256 model.vocab_size=1024
        model.max_seq_len=64 train.seq_len=64)
  BIG_STEPS=8
  SMALL+=(model.n_layer=2 model.d_model=64 model.max_seq_len=64 train.seq_len=64 train.micro_batch=2)
  LLAMA=(model.arch=llama model.d_model=128 model.n_head=16 model.n_kv_head=8 model.qk_norm=true
         model.tie_embeddings=false)
  FAULT_STEPS=400; FAULT_TIMEOUT=10; COMM=(--backend gloo --min_bytes 65536 --max_bytes 4194304 --iters 3 --warmup 1)
  T_RUN=90; T_BIG=120
fi
# default modes per machine size (the issues' lists; tp must divide the shape's heads)
case $NPROC in
  4) bench_modes="ddp zero1 zero2 zero3 tp2 tp4"; qwen_modes="zero3 tp4"
     equiv_modes="ddp zero1 zero2 zero3 tp2 tp4 zero3+tp2" ;;
  8) bench_modes="ddp zero1 zero2 zero3"; qwen_modes="tp2 tp4 tp8 zero3+tp2 zero3"
     equiv_modes="ddp zero1 zero2 zero3 tp2 tp4 tp8 zero3+tp2" ;;
  *) bench_modes="ddp zero1 zero2 zero3 tp2"; qwen_modes="zero3 tp2"
     equiv_modes="ddp zero1 zero2 zero3 tp2 zero3+tp2" ;;
esac
BENCH_MODES=${BENCH_MODES:-$bench_modes}; QWEN_MODES=${QWEN_MODES:-$qwen_modes}
EQUIV_MODES=${EQUIV_MODES:-$equiv_modes}; BIG_TP=${BIG_TP:-2}

# ---- helpers ----
cat >"$TMP/gs.py" <<'PY'
"""Parsing and arithmetic for gpu_scale.sh: one subcommand per use."""
import json, os, re, statistics, sys

def rows(d):
    try:
        return [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl")) if '"tokens_per_s"' in l]
    except OSError:
        return []

def shape(cfg, over):
    """Matmul parameters (blocks + head) and FLOPs per token of a config with overrides."""
    try:
        import tomllib
        c = tomllib.load(open(cfg, "rb"))
    except ImportError:  # Python < 3.11: the configs are flat "key = value" tables
        c, cur = {}, None
        for l in open(cfg):
            l = l.split("#")[0].strip()
            if l.startswith("["):
                cur = c.setdefault(l.strip("[]").strip(), {})
            elif "=" in l and cur is not None:
                k, _, v = l.partition("=")
                cur[k.strip()] = v.strip().strip('"')
    sec = {"model": dict(c.get("model", {})), "train": dict(c.get("train", {}))}
    for o in over:
        k, _, v = o.partition("=")
        s, _, key = k.partition(".")
        if s in sec:
            sec[s][key] = v
    m, t = sec["model"], sec["train"]
    gi = lambda k, d=0: int(float(m.get(k) or d))
    L, d, H = gi("n_layer"), gi("d_model"), gi("n_head")
    kv, hd, V = gi("n_kv_head", H), gi("head_dim", d // H), gi("vocab_size")
    gpt2 = str(m.get("arch", "gpt2")).strip('"') == "gpt2"
    ff = gi("d_ff") or (4 * d if gpt2 else (8 * d // 3 + 63) // 64 * 64)
    T = int(float(t.get("seq_len", 1024)))
    per_layer = d * H * hd + 2 * d * kv * hd + H * hd * d + (2 if gpt2 else 3) * d * ff
    n_mm = L * per_layer + V * d          # the head's matmul costs 6 V d per token, tied or not
    shape.total = n_mm + (0 if str(m.get("tie_embeddings", gpt2)).strip('"').lower() == "true" else V * d)
    return n_mm, 6 * n_mm + 12 * L * H * hd * T, T

def cmd_flops(cfg, *over):
    """matmul parameters, FLOPs per token, all parameters (norms left out)"""
    n, f, T = shape(cfg, over)
    print("%d %.6e %d" % (n, f, shape.total))

def mem_text(log, smi):
    text = open(log, errors="replace").read()
    est = re.findall(r"memory: rank (\d+): estimated ([0-9.]+) MiB per rank \(model state ([0-9.]+) MiB\), "
                     r"measured peak ([0-9.]+) MiB", text)
    est.sort(key=lambda e: int(e[0]))
    if est:
        return "estimate %.0f MiB (model state %.0f)  measured peak %s MiB" % (
            float(est[0][1]), float(est[0][2]), "/".join("%.0f" % float(e[3]) for e in est))
    tab = re.search(r"^(?:\[rank0\]: )?  total +([0-9.]+) MiB", text, re.M)
    st = re.search(r"^(?:\[rank0\]: )?  = model state +([0-9.]+) MiB", text, re.M)
    peaks = ""
    if smi and os.path.exists(smi):
        mx = {}
        for l in open(smi):
            p = [x.strip() for x in l.split(",")]
            if len(p) == 2 and p[0].isdigit() and p[1].isdigit():
                mx[int(p[0])] = max(mx.get(int(p[0]), 0), int(p[1]))
        peaks = "/".join(str(mx[i]) for i in sorted(mx))
    return "estimate %s MiB (model state %s)  peak used (nvidia-smi) %s MiB" % (
        tab.group(1) if tab else "?", st.group(1) if st else "?", peaks or "?")

def cmd_row(name, n, b, d, log, skip, t1, b_want, cfg="", *over):
    """One result line; writes d/tps. t1: the 1-GPU tokens/s (0: no efficiency)."""
    n, b, skip, t1 = int(n), int(b), int(skip), float(t1)
    r = rows(d)[skip:]
    tps = statistics.median(x["tokens_per_s"] for x in r) if r else 0.0
    if r:  # the shell reads d/tps back (absent: 0)
        open(os.path.join(d, "tps"), "w").write("%.1f\n" % tps)
    if not r and os.path.exists(log) and open(log).read().startswith("skipped:"):
        print("%-22s skipped (part time budget)" % name)
        return
    if not r:
        tail = [l.strip() for l in open(log, errors="replace") if l.strip()][-2:] if os.path.exists(log) else []
        print("%-22s FAILED: %s" % (name, " | ".join(tail)[-300:]))
        return
    line = "%-22s B=%-3d %10.0f tok/s (%8.0f per GPU, %d steps)" % (name, b, tps, tps / n, len(r))
    if t1 > 0:
        line += "  eff %5.1f%%" % (100.0 * tps / (n * t1))
    if cfg:
        try:
            _, f, _ = shape(cfg, over)
            line += "  MFU %4.1f%%" % (100.0 * tps / n * f / (float(os.environ.get("PEAK_TFLOPS", "989")) * 1e12))
        except (OSError, KeyError, ValueError, ZeroDivisionError) as e:
            line += "  MFU ? (%s)" % e
    line += "  " + mem_text(log, os.environ.get("SMI_FILE", ""))
    if b != int(b_want):
        line += "  (micro-batch %s did not fit: %d)" % (b_want, b)
    print(line)

def cmd_compare(name, a, b, tol):
    x, y, tol = rows(a), rows(b), float(tol)
    worst = max(abs(p["loss"] - q["loss"]) / abs(p["loss"]) for p, q in zip(x, y)) if x and y else float("inf")
    ok = len(x) == len(y) >= 10 and worst <= tol
    print("%-38s %s  worst relative loss difference %.2e over %d steps (tolerance %g)" % (
        name, "ok  " if ok else "FAIL", worst, min(len(x), len(y)), tol))

def cmd_torch(n, ct1, ctddp, jsonfile):
    """Summary of the torch part from its JSON lines and the ctrain numbers of the same part."""
    n, ct1, ctddp = int(n), float(ct1), float(ctddp)
    t = {}
    for l in open(jsonfile):
        try:
            j = json.loads(l)
            t[j["mode"]] = j
        except (ValueError, KeyError):
            pass
    tp = lambda m: t[m]["tokens_per_s"] if m in t else 0.0
    eff = lambda x, one: "%.1f%%" % (100 * x / (n * one)) if x and one else "n/a"
    ratio = lambda a, b: "%.2fx" % (a / b) if a and b else "n/a"
    print("ctrain 1 GPU %.0f tok/s, ddp x%d %.0f tok/s (eff %s); torch single %.0f, ddp %.0f (eff %s), fsdp2 %.0f (eff %s)"
          % (ct1, n, ctddp, eff(ctddp, ct1), tp("single"), tp("ddp"), eff(tp("ddp"), tp("single")),
             tp("fsdp2"), eff(tp("fsdp2"), tp("single"))))
    print("summary: ctrain ddp / torch ddp = %s; ctrain 1 GPU / torch single = %s"
          % (ratio(ctddp, tp("ddp")), ratio(ct1, tp("single"))))
    print("target (issue #10): ddp ahead of PyTorch DDP: %s" % (
        "n/a" if not (ctddp and tp("ddp")) else "met" if ctddp > tp("ddp") else "NOT met"))

def cmd_targets(n, t1, ddp, zero3):
    n, t1, ddp, zero3 = int(n), float(t1), float(ddp), float(zero3)
    want = 98.0 if n <= 4 else 97.0
    if t1 and ddp:
        e = 100 * ddp / (n * t1)
        print("target: ddp scaling >= %.0f%% at %d GPUs: %.1f%% %s" % (want, n, e, "met" if e >= want else "NOT met"))
    if ddp and zero3:
        g = 100 * (1 - zero3 / ddp)
        print("target: zero3 within 5%% of ddp: %.1f%% behind %s" % (g, "met" if g <= 5 else "NOT met"))

def cmd_big(n, tps, cfg, *over):
    n, tps = int(n), float(tps)
    nmm, f, T = shape(cfg, over)
    per = tps / n
    peak = float(os.environ.get("PEAK_TFLOPS", "989")) * 1e12
    print("  per GPU %.0f tok/s, %.1f GFLOP/token (6 x %.2fB matmul params + attention at T=%d), MFU %.1f%% of %.0f TFLOP/s"
          % (per, f / 1e9, nmm / 1e9, T, 100 * per * f / peak, peak / 1e12))
    print("  vs torchtitan Llama 3.1 8B, 8 x H100, FSDP 5,762 tok/s/GPU: %.2fx; FSDP + torch.compile 6,667: %.2fx%s"
          % (per / 5762, per / 6667, "  (target: ahead of FSDP: %s)" % ("met" if per > 5762 else "NOT met")))

getattr(sys.modules[__name__], "cmd_" + sys.argv[1])(*sys.argv[2:])
PY
gs() { python3 "$TMP/gs.py" "$@"; }

t_part=0
left() { echo $((PART_BUDGET - ($(date +%s) - t_part))); }
# limit WANT: WANT seconds, or what the part budget has left (less a margin); 0 = skip
limit() { local l; l=$(($(left) - 15)); [ "$l" -lt 30 ] && { echo 0; return; }; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }

# mode SPEC: sets MARGS (overrides), MDP (data-parallel degree), MLABEL
mode() {
  local s=$1 tp=1 data=ddp
  case $s in
    tp*) tp=${s#tp} ;;
    *+tp*) data=${s%%+*}; tp=${s##*+tp} ;;
    *) data=$s ;;
  esac
  MARGS=(parallel.data="$data" parallel.tensor="$tp")
  MDP=$((NPROC / tp))
  if [ "$tp" = 1 ]; then MLABEL=$data
  elif [ "$MDP" = 1 ]; then MLABEL="tp=$tp"
  elif [ "$data" = ddp ]; then MLABEL="tp=$tp x dp=$MDP"
  else MLABEL="$data x tp=$tp (dp=$MDP)"; fi
}

# launch N SECONDS DIR LOG ARGS...: ctrain train for one process, ctrain-launch for more
launch() {
  local n=$1 t=$2 dir=$3 log=$4
  shift 4
  rm -rf "$dir"
  if [ "$t" -le 0 ]; then echo "skipped: part time budget ($PART_BUDGET s) spent" >"$log"; return 124; fi
  if [ "$n" = 1 ]; then
    timeout -k 20 "$t" "$CT" train "$@" "train.out_dir=$dir" >"$log" 2>&1
  else
    timeout -k 20 "$t" "$LAUNCH" --nproc_per_node "$n" --standalone --grace_period 10 "$@" \
      "train.out_dir=$dir" >"$log" 2>&1
  fi
}

# measure NAME N SKIP BLIST T1 [cfg-for-MFU] -- ARGS...: the first micro-batch of BLIST that
# fits (out of memory: the next), then one result line
measure() {
  local name=$1 n=$2 skip=$3 blist=$4 t1=$5 cfg=$6 b
  shift 7
  rm -rf "$TMP/m"
  for b in $blist; do
    launch "$n" "$(limit $T_RUN)" "$TMP/m" "$TMP/m.log" "$@" train.micro_batch="$b"
    grep -q "done:" "$TMP/m.log" && break
    grep -qiE "out of (device )?memory|cudaMalloc|NOMEM" "$TMP/m.log" || break
  done
  if [ -n "$cfg" ]; then gs row "$name" "$n" "$b" "$TMP/m" "$TMP/m.log" "$skip" "$t1" "${blist%% *}" "$@"
  else gs row "$name" "$n" "$b" "$TMP/m" "$TMP/m.log" "$skip" "$t1" "${blist%% *}"; fi
  TPS=$(cat "$TMP/m/tps" 2>/dev/null || echo 0)
}

# the resolved layout must be valid for the shape (heads, kv heads, d_ff, vocab divisible by tp)
preflight() { # N ARGS...
  local n=$1
  shift
  timeout 60 "$CT" memory "$@" --world "$n" >"$TMP/pre.log" 2>&1
}

gpu_header() {
  if [ "$DRY" = 1 ]; then echo "# DRY: CPU build $BUILD, $NPROC Gloo ranks on $(nproc) cores, tiny shapes: plumbing only, numbers mean nothing"
  else echo "# gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1) x $NPROC; NCCL_NVLS_ENABLE=0"; fi
}

# ---- parts ----
part_bench() {
  echo "# GPT-2 124M, bf16, T=1024, micro-batch per GPU 64 (smaller only if 64 did not fit), 20 steps median after 3"
  local t1 m ddp=0 zero3=0
  measure "1 GPU" 1 3 "$GPT2_B" 0 "" -- "${GPT2[@]}"
  t1=$TPS
  for m in $BENCH_MODES; do
    mode "$m"
    preflight "$NPROC" "${GPT2[@]}" "${MARGS[@]}" || { echo "$MLABEL: $(tail -1 "$TMP/pre.log")"; continue; }
    measure "$MLABEL" "$NPROC" 3 "$GPT2_B" "$t1" "" -- "${GPT2[@]}" "${MARGS[@]}"
    [ "$m" = ddp ] && ddp=$TPS
    [ "$m" = zero3 ] && zero3=$TPS
  done
  echo "# eff = tokens/s / ($NPROC x the 1-GPU tokens/s above); tp meshes: micro-batch 64 per data-parallel row"
  echo "# estimate: the trainer's (ctrain memory); peak: per rank, cudaMemGetInfo high-water mark incl. the CUDA context"
  gs targets "$NPROC" "$t1" "$ddp" "$zero3"
}

part_torch() {
  echo "# ctrain and PyTorch (torch.compile) on the same shapes in the same invocation: GPT-2 124M, bf16, T=1024"
  local t1 tddp b mode t
  measure "ctrain 1 GPU" 1 3 "$GPT2_B" 0 "" -- "${GPT2[@]}"
  t1=$TPS
  measure "ctrain ddp" "$NPROC" 3 "$GPT2_B" "$t1" "" -- "${GPT2[@]}" parallel.data=ddp
  tddp=$TPS
  : >"$TMP/torch.jsonl"
  if [ "$DRY" = 1 ]; then
    echo "torch: not run (DRY: bench/torch_dist_ref.py needs CUDA)"
  else
    for mode in single ddp fsdp2; do
      for b in ${TORCH_B:-64 32}; do
        t=$(limit 240)
        [ "$t" = 0 ] && { echo "torch $mode: skipped (part time budget)"; break; }
        if [ $mode = single ]; then
          timeout -k 20 "$t" python3 bench/torch_dist_ref.py --mode single --micro_batch "$b" 2>"$TMP/t.log" | tee -a "$TMP/torch.jsonl"
        else
          timeout -k 20 "$t" torchrun --standalone --nproc_per_node "$NPROC" bench/torch_dist_ref.py --mode $mode \
            --micro_batch "$b" 2>"$TMP/t.log" | tee -a "$TMP/torch.jsonl"
        fi
        grep -q "\"mode\": \"$mode\"" "$TMP/torch.jsonl" && break
        echo "torch $mode B=$b failed: $(grep -v '^\s*$' "$TMP/t.log" | tail -1 | cut -c1-300)"
      done
    done
  fi
  gs torch "$NPROC" "$t1" "$tddp" "$TMP/torch.jsonl"
}

part_qwen() {
  echo "# Qwen3-0.6B shape (configs/qwen3-0.6b.toml: 28 layers, d=1024, 16 heads, 8 kv heads, vocab 151,936), T=2048, bf16,"
  echo "# micro-batch $QWEN_B per data-parallel row, median after 5 steps; MFU over ${PEAK_TFLOPS:-989} TFLOP/s per GPU"
  local t1 m
  measure "1 GPU" 1 5 "$QWEN_B 4" 0 configs/qwen3-0.6b.toml -- "${QWEN[@]}"
  t1=$TPS
  for m in $QWEN_MODES; do
    mode "$m"
    preflight "$NPROC" "${QWEN[@]}" "${MARGS[@]}" train.micro_batch="$QWEN_B" || { echo "$MLABEL: $(tail -1 "$TMP/pre.log")"; continue; }
    measure "$MLABEL" "$NPROC" 5 "$QWEN_B 4 2" "$t1" configs/qwen3-0.6b.toml -- "${QWEN[@]}" "${MARGS[@]}"
  done
  echo "# eff = tokens/s / ($NPROC x 1 GPU); memory: the trainer's estimate and each rank's measured peak"
}

# big: one 8B run per layout, cut after BIG_STEPS steps (SIGKILL to the workers: the final
# checkpoint, whole fp32 weights + moments ~ 96 GB, would cost minutes and disk)
big_run() { # NAME B ARGS...
  local name=$1 b=$2 t lpid w rows=0
  shift 2
  TPS=0
  t=$(limit $T_BIG)
  rm -rf "$TMP/g"
  [ "$t" = 0 ] && { echo "$name: skipped (part time budget)"; return; }
  : >"$TMP/smi.csv"
  if [ "$DRY" != 1 ]; then
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 >"$TMP/smi.csv" 2>/dev/null &
    SMI_PID=$!
  fi
  timeout -k 20 "$t" "$LAUNCH" --nproc_per_node "$NPROC" --standalone --grace_period 10 "$@" \
    train.micro_batch="$b" train.max_steps=100000 "train.out_dir=$TMP/g" >"$TMP/g.log" 2>&1 &
  local tpid=$!
  while kill -0 "$tpid" 2>/dev/null; do
    rows=$(grep -c '"tokens_per_s"' "$TMP/g/metrics.jsonl" 2>/dev/null)
    [ "${rows:-0}" -ge "$BIG_STEPS" ] && break
    sleep 1
  done
  if kill -0 "$tpid" 2>/dev/null; then
    lpid=$(pgrep -P "$tpid" | head -1)
    w=$(pgrep -P "${lpid:-$tpid}" | tr '\n' ' ')
    # shellcheck disable=SC2086  # the worker pids, one word each
    [ -n "$w" ] && kill -KILL $w 2>/dev/null
  fi
  wait "$tpid" 2>/dev/null
  [ -n "$SMI_PID" ] && { kill "$SMI_PID" 2>/dev/null; wait "$SMI_PID" 2>/dev/null; SMI_PID=; }
  SMI_FILE=$TMP/smi.csv gs row "$name" "$NPROC" "$b" "$TMP/g" "$TMP/g.log" 3 0 "$b" "$@"
  TPS=$(cat "$TMP/g/tps" 2>/dev/null || echo 0)
  grep -E "start-up|distributed:" "$TMP/g.log" | head -2 | sed 's/^/    /'
  [ "$TPS" != 0 ] && gs big "$NPROC" "$TPS" "$@"
}

part_big() {
  echo "# Llama-3.1-8B shape (configs/llama-8b.toml: 32 layers, d=4096, 32 heads, 8 kv heads, d_ff 14336, vocab 128,256), T=2048,"
  echo "# bf16, random init; median tokens/s after 3 steps; the workers are killed once $BIG_STEPS steps are logged (no final checkpoint)"
  [ "$NPROC" -ge 8 ] || echo "# (issue #11 asks for this at 8 GPUs; running at $NPROC)"
  local ddp tp b est cand mem n host need
  ddp=$(timeout 60 "$CT" memory "${BIG[@]}" parallel.data=ddp train.micro_batch=1 --world "$NPROC" 2>&1 | sed -n 's/^  total *\([0-9.]*\) MiB/\1/p')
  if [ "$DRY" = 1 ]; then mem=1000000; else
    mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1); fi
  echo "ddp (replicated) would need ${ddp:-?} MiB per GPU at micro-batch 1 (ctrain memory); one GPU has $mem MiB"
  host=$(awk '/MemAvailable/ {print int($2 / 1024)}' /proc/meminfo)
  read -r _ _ n < <(gs flops "${BIG[@]}")
  for tp in 1 $BIG_TP; do
    local args=("${BIG[@]}" parallel.data=zero3 parallel.tensor="$tp") label
    [ "$tp" = 1 ] && label="zero3 (dp=$NPROC)" || label="zero3 x tp=$tp (dp=$((NPROC / tp)))"
    preflight "$NPROC" "${args[@]}" || { echo "$label: $(tail -1 "$TMP/pre.log")"; continue; }
    # the largest micro-batch whose estimate stays under 60% of the GPU (zero3 builds the whole
    # local model on the GPU before sharding it: weights + working copy + activations)
    b=""
    for cand in ${BIG_B:-8 4 2 1}; do
      est=$(timeout 60 "$CT" memory "${args[@]}" train.micro_batch="$cand" --world "$NPROC" 2>&1 | sed -n 's/^  total *\([0-9.]*\) MiB/\1/p')
      if [ -n "$est" ] && [ "${est%.*}" -lt $((mem * 6 / 10)) ]; then b=$cand; break; fi
    done
    [ -z "$b" ] && { echo "$label: no micro-batch in '${BIG_B:-8 4 2 1}' fits under 60% of $mem MiB"; continue; }
    # tensor parallelism builds the whole fp32 model in host memory on every rank (train.c
    # full_host_model: its weights only, drawn in place by ct_model_init_weights = 4 B/param)
    if [ "$tp" != 1 ]; then
      need=$(python3 -c "print(int($NPROC * ${HOST_B_PER_PARAM:-4} * $n / 2**20))")
      if [ "$need" -gt "$host" ] && [ "${BIG_FORCE:-0}" != 1 ]; then
        echo "$label: skipped: every rank builds the whole fp32 model in host memory for tp (~${HOST_B_PER_PARAM:-4} B/param):"
        echo "    $NPROC x ${HOST_B_PER_PARAM:-4} x $n params = $need MiB > MemAvailable $host MiB (BIG_FORCE=1 runs it anyway)"
        continue
      fi
    fi
    echo "$label: micro-batch $b (estimate $est MiB per GPU)"
    big_run "$label" "$b" "${args[@]}"
    # out of memory after all (the estimate leaves out transients): once more at half the batch
    if [ "$TPS" = 0 ] && [ "$b" -gt 1 ] && grep -qiE "out of (device )?memory|cudaMalloc|NOMEM" "$TMP/g.log"; then
      echo "$label: out of memory at micro-batch $b: trying $((b / 2))"
      big_run "$label" $((b / 2)) "${args[@]}"
    fi
  done
  echo "# MFU: (6 x matmul params + 12 x layers x heads x head_dim x T) FLOPs per token / ${PEAK_TFLOPS:-989} TFLOP/s (dense bf16, H100/H200)"
  echo "# torchtitan docs/performance.md: Llama 3.1 8B on 8 x H100 (96 GB, 500 W), local batch 2, selective activation"
  echo "# checkpointing; 33-39% MFU. Not the same sequence length or hardware clocks: a rough yardstick."
}

part_equiv() {
  if [ "$DRY" != 1 ]; then
    echo "# NCCL process group test at all visible GPUs"
    timeout 300 "$BUILD/tests/test_comm_nccl" 2>&1 | tail -4
  fi
  echo "# equivalence at $NPROC ranks vs 1 rank with the same global batch, bf16, 10 steps"
  local arch m extra refs=" "
  # ref DP: the 1-rank run with grad_accum = DP (the same global batch as DP data-parallel rows)
  ref() {
    [[ "$refs" == *" $arch-$1 "* ]] && return
    launch 1 "$(limit 120)" "$TMP/$arch-ref$1" "$TMP/log" "${SMALL[@]}" "${extra[@]}" train.grad_accum="$1" ||
      tail -2 "$TMP/log"
    refs+="$arch-$1 "
  }
  for arch in gpt2 llama; do
    extra=()
    [ $arch = llama ] && extra=("${LLAMA[@]}")
    for m in $EQUIV_MODES; do
      mode "$m"
      [ "$(limit 120)" = 0 ] && { echo "$arch $MLABEL: skipped (part time budget)"; continue; }
      preflight "$NPROC" "${SMALL[@]}" "${extra[@]}" "${MARGS[@]}" || { echo "$arch $MLABEL: $(tail -1 "$TMP/pre.log")"; continue; }
      ref "$MDP"
      launch "$NPROC" "$(limit 120)" "$TMP/$arch-$m" "$TMP/log" "${SMALL[@]}" "${extra[@]}" "${MARGS[@]}" || tail -2 "$TMP/log"
      gs compare "$arch $MLABEL ($NPROC ranks)" "$TMP/$arch-ref$MDP" "$TMP/$arch-$m" 1e-2
    done
    [ "$(limit 120)" = 0 ] && { echo "$arch ddp 1 MiB buckets: skipped (part time budget)"; continue; }
    ref "$NPROC"
    launch "$NPROC" "$(limit 120)" "$TMP/$arch-ddp-b1" "$TMP/log" "${SMALL[@]}" "${extra[@]}" parallel.data=ddp \
      parallel.bucket_mb=1 || tail -2 "$TMP/log"
    grep -h "gradients all-reduced in" "$TMP/log" | head -1
    gs compare "$arch ddp 1 MiB buckets (overlap)" "$TMP/$arch-ref$NPROC" "$TMP/$arch-ddp-b1" 1e-2
  done
}

# the worker processes of a launcher started under timeout (pid $1): its grandchildren
workers_of() { local l; l=$(pgrep -P "$1" | head -1); [ -n "$l" ] && pgrep -P "$l"; }

part_fault() {
  local to=$FAULT_TIMEOUT sig victim rc el t0 tpid t
  echo "# fault handling at $NPROC ranks, parallel.timeout_s = $to, --grace_period 10"
  for sig in KILL STOP; do
    rm -rf "$TMP/f"
    t=$(limit 200)
    [ "$t" = 0 ] && { echo "SIG$sig: skipped (part time budget)"; continue; }
    timeout -k 20 "$t" "$LAUNCH" --nproc_per_node "$NPROC" --standalone --grace_period 10 "${SMALL[@]}" \
      train.max_steps=1000000 parallel.timeout_s="$to" "train.out_dir=$TMP/f" >"$TMP/f.log" 2>&1 &
    tpid=$!
    for _ in $(seq 1 600); do [ -s "$TMP/f/metrics.jsonl" ] && break; sleep 0.2; done
    sleep 2
    victim=$(workers_of "$tpid" | tail -1)
    [ -z "$victim" ] && { echo "SIG$sig: no worker found: FAIL"; kill "$tpid"; wait "$tpid"; continue; }
    t0=$(date +%s.%N)
    kill -"$sig" "$victim"
    wait "$tpid"
    rc=$?
    el=$(python3 -c "import time; print('%.1f' % (time.time() - $t0))")
    [ $sig = STOP ] && { kill -CONT "$victim" 2>/dev/null; kill -KILL "$victim" 2>/dev/null; }
    echo "SIG$sig to worker pid $victim: launcher exit $rc after $el s (limit: timeout $to s + grace 10 s)"
    grep -E "failed|timed out|did not finish|SIGKILL|error" "$TMP/f.log" | head -4 | cut -c1-300 | sed 's/^/    /'
    python3 -c "import sys; sys.exit(0 if $rc != 0 and $rc != 124 and $el <= $to + 15 else 1)" && echo "  ok" || echo "  FAIL"
  done
  # restart: kill one worker after the first checkpoint; the group restarts from ckpt/latest
  local every=$((FAULT_STEPS / 10)) at last
  rm -rf "$TMP/r"
  t=$(limit 300)
  [ "$t" = 0 ] && { echo "--max_restarts 1: skipped (part time budget)"; return; }
  timeout -k 20 "$t" "$LAUNCH" --nproc_per_node "$NPROC" --standalone --grace_period 10 --max_restarts 1 \
    "${SMALL[@]}" train.max_steps="$FAULT_STEPS" train.checkpoint_every="$every" parallel.timeout_s="$to" \
    "train.out_dir=$TMP/r" >"$TMP/r.log" 2>&1 &
  tpid=$!
  for _ in $(seq 1 1500); do [ -e "$TMP/r/ckpt/latest" ] && break; kill -0 "$tpid" 2>/dev/null || break; sleep 0.2; done
  at=$(readlink "$TMP/r/ckpt/latest" 2>/dev/null)
  victim=$(workers_of "$tpid" | tail -1)
  if [ -n "$victim" ] && [ -n "$at" ]; then
    kill -KILL "$victim"
    t0=$(date +%s.%N)
  else
    echo "restart: the run ended before a worker could be killed after its first checkpoint (raise FAULT_STEPS)"
  fi
  wait "$tpid"
  rc=$?
  el=$(python3 -c "import time; print('%.1f' % (time.time() - ${t0:-0}))")
  last=$(readlink "$TMP/r/ckpt/latest" 2>/dev/null)
  echo "--max_restarts 1: SIGKILL to worker pid $victim after checkpoint $at; launcher exit $rc $el s later; final checkpoint $last"
  grep -E "worker failure|restarting|resumed from|done:" "$TMP/r.log" | head -6 | cut -c1-300 | sed 's/^/    /'
  if [ "$rc" = 0 ] && grep -q "restarting the worker group" "$TMP/r.log" && grep -q "resumed from" "$TMP/r.log" &&
     [ "$last" = "$(printf 'step_%08d' "$FAULT_STEPS")" ]; then echo "  ok (resumed and completed $FAULT_STEPS steps)"
  else echo "  FAIL"; tail -3 "$TMP/r.log" | sed 's/^/    /'; fi
}

part_comm() {
  echo "# ctrain comm layer, $NPROC ranks (ctrain-launch --cmd comm_bench), nccl-tests style: busbw = algbw x 2(n-1)/n"
  echo "# for all-reduce, x (n-1)/n for reduce-scatter and all-gather; time averaged over ranks after warm-up"
  local t
  t=$(limit 300)
  [ "$t" = 0 ] && { echo "comm: skipped (part time budget)"; return; }
  timeout -k 20 "$t" "$LAUNCH" --nproc_per_node "$NPROC" --standalone --grace_period 10 --log_dir "$TMP/comm" \
    --local_ranks_filter 0 --cmd "$BUILD/bench/comm_bench" -- "${COMM[@]}" >"$TMP/comm.log" 2>&1
  echo "(exit $?)"
  sed -n 's/^\[rank0\]: //p' "$TMP/comm.log"
  grep -hiE "error|fail" "$TMP/comm.log" "$TMP"/comm/rank_*.log 2>/dev/null | head -3
}

parts=("$@")
[ $# = 0 ] && parts=(bench torch qwen big equiv fault comm)
for p in "${parts[@]}"; do
  declare -F "part_$p" >/dev/null || { echo "unknown part $p (bench torch qwen big equiv fault comm)"; exit 2; }
  f=$OUT/gpu_scale_${p}_$tag.txt
  echo "== $p -> $f"
  t_part=$(date +%s)
  {
    echo "# bench/gpu_scale.sh $p, $(date -u +%FT%TZ), commit $commit, $NPROC x ${gpu:-GPU}, host $(uname -n)"
    gpu_header
    "part_$p"
    echo "# part $p took $(($(date +%s) - t_part)) s"
  } 2>&1 | tee "$f"
done

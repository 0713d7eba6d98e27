#!/usr/bin/env bash
# bench/gpu_dist.sh — multi-GPU session for issue #6 (2-GPU machine, CUDA build in build-gpu):
#   equiv  tests/gpu/test_comm_nccl (collectives, overlap mode), then
#          bf16 10-step losses of ddp, zero1, zero2, zero3 and tp=2 on 2 GPUs against 1 GPU with
#          the same global batch (<= 1e-2 relative), gpt2 and llama (GQA, qk_norm) shapes
#   fault  a worker killed with SIGKILL, and one frozen with SIGSTOP, turn into a launcher-
#          reported failure within parallel.timeout_s (+ the grace period)
#   ckpt   checkpoints move between GPU and CPU and between layouts: zero3@2 GPUs -> ddp on the
#          CPU, tp=2 GPUs -> 1 GPU, CPU -> zero2@2 GPUs, each resuming at the saved step
#   bench  GPT-2 124M, bf16, micro-batch 64 per GPU (smaller when 64 does not fit: said so),
#          T=1024: tokens/s on 1 GPU and on 2 GPUs with ddp, zero1, zero2, zero3, tp=2, scaling
#          efficiency, peak memory per GPU next to ctrain's estimate
#   torch  PyTorch DDP (torch.compile) and FSDP2 (fully_shard) on the same shapes (torchrun)
#   comm   all-reduce / reduce-scatter / all-gather bandwidth of ctrain's comm layer (NCCL)
# usage: bench/gpu_dist.sh [PART ...]   (default: all parts in this order; each stays well under
# 10 minutes on 2 x H200). Results: $OUT/gpu_dist_<part>.txt (default OUT=bench/results).
set -uo pipefail
: "${OUT:=bench/results}"
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0
BUILD=${BUILD:-build-gpu}
CT=$BUILD/ctrain
LAUNCH=$BUILD/ctrain-launch
mkdir -p data "$OUT"
[ -f data/fortunes/train.h5 ] || "$CT" prepare --out-dir data/fortunes >/dev/null 2>&1 ||
  "$CT" prepare --out-dir data/fortunes /usr/lib/python3*/*.py >/dev/null 2>&1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
PARTS=${*:-equiv fault ckpt bench torch comm}

# small shapes for the correctness parts (seconds per run)
SMALL=${SMALL:-"configs/smoke.toml model.n_layer=4 model.d_model=256 model.n_head=8 model.max_seq_len=256
       train.seq_len=256 train.micro_batch=8 train.max_steps=10 train.eval_every=0 data.val=
       train.sample_tokens=0 train.warmup_steps=2 train.precision=bf16"}
LLAMA="model.arch=llama model.n_kv_head=4 model.qk_norm=true model.tie_embeddings=false"
losses() { python3 -c "
import json,sys
print(' '.join('%.6f' % json.loads(l)['loss'] for l in open(sys.argv[1] + '/metrics.jsonl') if '\"tokens_per_s\"' in l))" "$1"; }
compare() { # compare NAME DIR_REF DIR TOL
  python3 - "$@" <<'PY'
import json, sys
name, a, b, tol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
rows = lambda d: [json.loads(l) for l in open(d + "/metrics.jsonl") if '"tokens_per_s"' in l]
try:
    x, y = rows(a), rows(b)
except OSError as e:
    print("%-34s FAIL (%s)" % (name, e)); sys.exit(0)
worst = max(abs(p["loss"] - q["loss"]) / abs(p["loss"]) for p, q in zip(x, y)) if x and y else float("inf")
ok = len(x) == len(y) >= 10 and worst <= tol
print("%-34s %s  worst relative loss difference %.2e over %d steps (tolerance %g)" % (name, "ok  " if ok else "FAIL", worst, min(len(x), len(y)), tol))
PY
}

part_equiv() {
  echo "# NCCL process group (incl. overlap mode on a split copy), $(date -u +%FT%TZ), commit $commit"
  timeout 300 "$BUILD/tests/test_comm_nccl" 2>&1 | tail -4
  echo "# equivalence on 2 GPUs vs 1 GPU, bf16, $(date -u +%FT%TZ), commit $commit"
  for arch in gpt2 llama; do
    extra=""
    [ $arch = llama ] && extra=$LLAMA
    "$CT" train $SMALL $extra train.grad_accum=2 "train.out_dir=$TMP/$arch-1gpu" >"$TMP/log" 2>&1 || tail -3 "$TMP/log"
    "$CT" train $SMALL $extra "train.out_dir=$TMP/$arch-1gpu-b1" >"$TMP/log" 2>&1 || tail -3 "$TMP/log"
    for mode in ddp zero1 zero2 zero3; do
      "$LAUNCH" --nproc_per_node 2 --standalone $SMALL $extra parallel.data=$mode \
        "train.out_dir=$TMP/$arch-$mode" >"$TMP/log" 2>&1 || tail -3 "$TMP/log"
      compare "$arch $mode (2 GPUs)" "$TMP/$arch-1gpu" "$TMP/$arch-$mode" 1e-2
    done
    "$LAUNCH" --nproc_per_node 2 --standalone $SMALL $extra parallel.tensor=2 \
      "train.out_dir=$TMP/$arch-tp2" >"$TMP/log" 2>&1 || tail -3 "$TMP/log"
    compare "$arch tp=2 (2 GPUs)" "$TMP/$arch-1gpu-b1" "$TMP/$arch-tp2" 1e-2
    "$LAUNCH" --nproc_per_node 2 --standalone $SMALL $extra parallel.data=ddp parallel.bucket_mb=1 \
      "train.out_dir=$TMP/$arch-ddp-b1" >"$TMP/log" 2>&1 || tail -3 "$TMP/log"
    grep -h "buckets" "$TMP/log" | head -1
    compare "$arch ddp 1 MiB buckets (overlap)" "$TMP/$arch-1gpu" "$TMP/$arch-ddp-b1" 1e-2
    # the same sums whichever way the buckets go: 2 ranks add a + b, so the losses are bit-equal
    "$LAUNCH" --nproc_per_node 2 --standalone $SMALL $extra parallel.data=ddp parallel.bucket_mb=1 \
      parallel.overlap=false "train.out_dir=$TMP/$arch-ddp-after" >"$TMP/log" 2>&1 || tail -3 "$TMP/log"
    grep -h "buckets" "$TMP/log" | head -1
    compare "$arch ddp after backward = overlapped" "$TMP/$arch-ddp-b1" "$TMP/$arch-ddp-after" 0
    "$LAUNCH" --nproc_per_node 2 --standalone $SMALL $extra parallel.data=ddp parallel.bucket_mb=1 \
      parallel.overlap_ctas=2 "train.out_dir=$TMP/$arch-ddp-lean" >"$TMP/log" 2>&1 || tail -3 "$TMP/log"
    compare "$arch ddp lean (overlap_ctas=2) = full" "$TMP/$arch-ddp-b1" "$TMP/$arch-ddp-lean" 0
    # a bf16 wire rounds each gradient once, the same way overlapped or not (against 1 GPU it moved
    # gpt2's step-7 loss by 4%: bench/results/gpu_dist_equiv_2026-11-30_2xH200_133fb80.txt)
    "$LAUNCH" --nproc_per_node 2 --standalone $SMALL $extra parallel.data=ddp parallel.bucket_mb=1 \
      parallel.reduce_dtype=bf16 "train.out_dir=$TMP/$arch-ddp-16" >"$TMP/log" 2>&1 || tail -3 "$TMP/log"
    "$LAUNCH" --nproc_per_node 2 --standalone $SMALL $extra parallel.data=ddp parallel.bucket_mb=1 \
      parallel.overlap=false parallel.reduce_dtype=bf16 "train.out_dir=$TMP/$arch-ddp-after16" >"$TMP/log" 2>&1 || tail -3 "$TMP/log"
    compare "$arch ddp bf16 wire: after backward = overlapped" "$TMP/$arch-ddp-16" "$TMP/$arch-ddp-after16" 0
  done
}

part_fault() {
  echo "# fault handling on 2 GPUs, parallel.timeout_s = 30, $(date -u +%FT%TZ), commit $commit"
  for sig in KILL STOP; do
    rm -rf "$TMP/f"
    "$LAUNCH" --nproc_per_node 2 --standalone --grace_period 10 $SMALL train.max_steps=100000 \
      parallel.timeout_s=30 "train.out_dir=$TMP/f" >"$TMP/f.log" 2>&1 &
    lpid=$!
    for i in $(seq 1 600); do [ -s "$TMP/f/metrics.jsonl" ] && break; sleep 0.2; done
    sleep 2
    victim=$(pgrep -f "train.out_dir=$TMP/f" -P "$(pgrep -d, -P $lpid)" | tail -1)
    [ -z "$victim" ] && victim=$(pgrep -f "ctrain train.*train.out_dir=$TMP/f" | tail -1)
    t0=$(date +%s.%N)
    kill -$sig "$victim"
    wait $lpid
    rc=$?
    el=$(python3 -c "import time; print('%.1f' % (time.time() - $t0))")
    [ $sig = STOP ] && kill -CONT "$victim" 2>/dev/null
    echo "SIG$sig to worker pid $victim: launcher exit $rc after $el s (limit: timeout 30 s + grace 10 s)"
    grep -E "failed|timed out|did not finish|SIGKILL|error" "$TMP/f.log" | head -4 | sed 's/^/    /'
    python3 -c "import sys; sys.exit(0 if $rc != 0 and $el <= 45 else 1)" && echo "  ok" || echo "  FAIL"
    pkill -9 -f "train.out_dir=$TMP/f" 2>/dev/null
  done
}

part_ckpt() {
  echo "# checkpoints across devices and layouts, $(date -u +%FT%TZ), commit $commit"
  C="$SMALL train.precision=auto"
  resume_check() { # NAME DIR
    if grep -q "resumed from .* at step 5" "$TMP/log" && [ "$(readlink "$2/ckpt/latest")" = step_00000010 ]; then
      echo "$1: ok (resumed at step 5, losses $(losses "$2" | cut -d' ' -f6-))"
    else echo "$1: FAIL"; tail -3 "$TMP/log"; fi
  }
  "$LAUNCH" --nproc_per_node 2 --standalone $C parallel.data=zero3 train.stop_after=5 "train.out_dir=$TMP/c1" >"$TMP/log" 2>&1
  CUDA_VISIBLE_DEVICES= "$CT" train $C train.grad_accum=2 train.resume=auto "train.out_dir=$TMP/c1" >"$TMP/log" 2>&1
  resume_check "zero3 @ 2 GPUs (bf16) -> ddp @ CPU (fp32)" "$TMP/c1"
  "$LAUNCH" --nproc_per_node 2 --standalone $C parallel.tensor=2 train.stop_after=5 "train.out_dir=$TMP/c2" >"$TMP/log" 2>&1
  "$CT" train $C train.resume=auto "train.out_dir=$TMP/c2" >"$TMP/log" 2>&1
  resume_check "tp=2 @ 2 GPUs -> 1 GPU" "$TMP/c2"
  CUDA_VISIBLE_DEVICES= "$CT" train $C train.grad_accum=2 train.stop_after=5 "train.out_dir=$TMP/c3" >"$TMP/log" 2>&1
  "$LAUNCH" --nproc_per_node 2 --standalone $C parallel.data=zero2 train.resume=auto "train.out_dir=$TMP/c3" >"$TMP/log" 2>&1
  resume_check "CPU (fp32) -> zero2 @ 2 GPUs (bf16)" "$TMP/c3"
  "$CT" generate --model "$TMP/c1/ckpt/latest" --prompt "The " --max_new_tokens 16 >/dev/null 2>&1 &&
    echo "generate from the zero3 checkpoint on the GPU: ok" || echo "generate from the zero3 checkpoint: FAIL"
}

part_bench() {
  echo "# GPT-2 124M, bf16, T=1024, micro-batch per GPU (64 unless it did not fit), $(date -u +%FT%TZ), commit $commit"
  echo "# gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)"
  G=${BENCH_SHAPE:-"configs/smoke.toml model.n_layer=12 model.d_model=768 model.n_head=12 model.vocab_size=50257
     model.max_seq_len=1024 train.seq_len=1024 train.max_steps=23 train.eval_every=0 data.val=
     train.sample_tokens=0 train.warmup_steps=5 train.lr=6e-4 train.precision=bf16 train.checkpoint_every=100000"}
  run_mode() { # NAME NPROC OVERRIDES... -> prints "name B tok/s est peak"
    local name=$1 n=$2 b
    shift 2
    for b in 64 48 32 16 8; do
      rm -rf "$TMP/b"
      if [ "$n" = 1 ]; then "$CT" train $G train.micro_batch=$b "$@" "train.out_dir=$TMP/b" >"$TMP/b.log" 2>&1
      else "$LAUNCH" --nproc_per_node "$n" --standalone $G train.micro_batch=$b "$@" "train.out_dir=$TMP/b" >"$TMP/b.log" 2>&1; fi
      if [ -s "$TMP/b/metrics.jsonl" ] && grep -q "done:" "$TMP/b.log"; then break; fi
      grep -qiE "out of memory|cudaMalloc|NOMEM" "$TMP/b.log" || { tail -3 "$TMP/b.log" >&2; break; }
    done
    python3 - "$name" "$b" "$TMP/b" "$TMP/b.log" <<'PY'
import json, re, statistics, sys
name, b, d, log = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
try:
    rows = [json.loads(l) for l in open(d + "/metrics.jsonl") if '"tokens_per_s"' in l][3:]
    tps = statistics.median(r["tokens_per_s"] for r in rows)
except (OSError, statistics.StatisticsError):
    tps = 0
text = open(log).read()
est = re.findall(r"estimated ([0-9.]+) MiB per rank \(model state ([0-9.]+) MiB\), measured peak ([0-9.]+) MiB", text)
peaks = [float(p) for _, _, p in est]
e = est[0] if est else ("?", "?", "?")
note = "" if b == 64 else "  (micro-batch 64 did not fit: %d)" % b
print("%-8s B=%-3d %10.0f tok/s  estimate %s MiB (model state %s)  measured peak %s MiB%s" % (
    name, b, tps, e[0], e[1], "/".join("%.0f" % p for p in peaks) or "?", note))
PY
  }
  # each GPU alone: the 2-GPU step goes at the slower one's pace (lent machines' second GPUs were
  # 0.5-3% slower than their first, bench/results/call37_8e3423c.txt), so both ratios are printed
  one=$(run_mode "1 GPU" 1)
  echo "$one"
  other=$(CUDA_VISIBLE_DEVICES=1 run_mode "1 GPU (GPU 1)" 1)
  echo "$other"
  t1=$(sed -n 's/.* \([0-9]*\) tok\/s.*/\1/p' <<<"$one")
  t1b=$(sed -n 's/.* \([0-9]*\) tok\/s.*/\1/p' <<<"$other")
  slow=$(( ${t1b:-0} > 0 && ${t1b:-0} < ${t1:-0} ? t1b : t1 ))
  for mode in ddp zero1 zero2 zero3 tp2; do
    if [ $mode = tp2 ]; then line=$(run_mode "tp=2" 2 parallel.tensor=2)
    else line=$(run_mode "$mode" 2 parallel.data=$mode); fi
    t2=$(sed -n 's/.* \([0-9]*\) tok\/s.*/\1/p' <<<"$line")
    eff=$(python3 -c "print('%.1f%%' % (100.0 * $t2 / (2 * $t1)) if $t1 > 0 else '?')" 2>/dev/null)
    effs=$(python3 -c "print('%.1f%%' % (100.0 * $t2 / (2 * $slow)) if $slow > 0 else '?')" 2>/dev/null)
    echo "$line  scaling efficiency $eff (vs 2 x 1 GPU), $effs (vs 2 x the slower GPU)"
  done
  echo "# estimates: $CT memory (per rank); peak: cudaMemGetInfo high-water mark incl. the CUDA context"
}

part_torch() {
  echo "# PyTorch on the same shapes (GPT-2 124M, bf16, T=1024), $(date -u +%FT%TZ), torchrun"
  for b in ${TORCH_B:-64 32}; do
    python3 bench/torch_dist_ref.py --mode single --micro_batch "$b" 2>"$TMP/t.log" && break
    tail -2 "$TMP/t.log"
  done
  for mode in ddp fsdp2; do
    for b in ${TORCH_B:-64 32}; do
      torchrun --standalone --nproc_per_node 2 bench/torch_dist_ref.py --mode $mode --micro_batch "$b" \
        2>"$TMP/t.log" && break
      tail -2 "$TMP/t.log"
    done
  done
}

part_comm() {
  echo "# ctrain comm layer over NCCL, 2 GPUs, $(date -u +%FT%TZ), commit $commit"
  port=$((29600 + RANDOM % 300))
  for r in 1 0; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout 300 "$BUILD/bench/comm_bench" --backend nccl --min_bytes 1048576 --max_bytes 1073741824 \
      --iters 20 --warmup 5 >"$TMP/comm$r.log" 2>&1 &
  done
  wait
  cat "$TMP/comm0.log"
  grep -h "error\|comm_bench:" "$TMP/comm1.log" | head -3
}

for p in $PARTS; do
  echo "== $p"
  "part_$p" 2>&1 | tee "$OUT/gpu_dist_$p.txt"
done

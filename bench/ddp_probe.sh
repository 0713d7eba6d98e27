#!/usr/bin/env bash
# bench/ddp_probe.sh — where the 2-GPU DDP step loses time against 1 GPU (issue #6): GPT-2 124M,
# bf16, micro-batch 64, T=1024, median tokens/s over steps 4..N of: one GPU alone; two
# independent one-GPU runs at once (the machine's own contention, no communication); ddp at the
# default bucket size; ddp with the overrides in $EXTRA and the environment settings in $ENVS (one run each);
# with PROFILE=1 the per-op profiles of 1 GPU and 2-GPU ddp, with MARKS=1 the mean time of each
# phase of the step (CT_STEP_MARKS). Prints one line per run.
#   usage: bench/ddp_probe.sh [BUILD_DIR]   env: STEPS (23), EXTRA, ENVS, PROFILE, MARKS
#   e.g. EXTRA=parallel.ce_allreduce=true bench/ddp_probe.sh build-gpu: the copy-engine bucket
#   all-reduce (parallel/comm_ce.c) against NCCL's, tokens/s of each
set -uo pipefail
BUILD=${1:-build-gpu}
cd "$(dirname "$0")/.."
CT=$BUILD/ctrain LAUNCH=$BUILD/ctrain-launch
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
[ -f data/fortunes/train.h5 ] || "$CT" prepare --out-dir data/fortunes >/dev/null 2>&1 ||
  "$CT" prepare --out-dir data/fortunes /usr/lib/python3*/*.py >/dev/null 2>&1
G="configs/smoke.toml model.n_layer=12 model.d_model=768 model.n_head=12 model.vocab_size=50257
   model.max_seq_len=1024 train.seq_len=1024 train.max_steps=${STEPS:-23} train.eval_every=0 data.val=
   train.sample_tokens=0 train.warmup_steps=5 train.lr=6e-4 train.precision=bf16
   train.checkpoint_every=100000 train.micro_batch=64"
med() { python3 -c "
import json, statistics, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '\"tokens_per_s\"' in l][3:]
print('%.0f' % statistics.median(x['tokens_per_s'] for x in r) if r else 'failed')" "$1/metrics.jsonl" 2>/dev/null || echo failed; }
one() { # NAME DIR [overrides]
  local name=$1 d=$TMP/$2; shift 2
  "$CT" train $G "train.out_dir=$d" "$@" >"$d.log" 2>&1
  printf '%-40s %s tok/s\n' "$name" "$(med "$d")"
}
two() { # NAME DIR [overrides]
  local name=$1 d=$TMP/$2; shift 2
  NCCL_NVLS_ENABLE=0 "$LAUNCH" --nproc_per_node 2 --standalone $G "train.out_dir=$d" "$@" >"$d.log" 2>&1
  printf '%-40s %s tok/s (both ranks)\n' "$name" "$(med "$d")"
}
one "1 GPU" a
CUDA_VISIBLE_DEVICES=0 "$CT" train $G "train.out_dir=$TMP/b0" >"$TMP/b0.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 "$CT" train $G "train.out_dir=$TMP/b1" >"$TMP/b1.log" 2>&1 &
wait
printf '%-40s %s + %s tok/s\n' "2 independent 1-GPU runs at once" "$(med "$TMP/b0")" "$(med "$TMP/b1")"
two "ddp bucket 25 MiB" c
for x in ${EXTRA:-}; do two "ddp $x" "x$RANDOM" $x; done
for e in ${ENVS:-}; do export "$e"; two "ddp $e" "e$RANDOM"; unset "${e%%=*}"; done
if [ -n "${PROFILE:-}" ]; then
  CT_CUDA_PROFILE=1 "$CT" train $G "train.out_dir=$TMP/p1" >"$TMP/p1.log" 2>&1
  echo "== profile, 1 GPU"; grep -A40 "cuda op profile" "$TMP/p1.log"
  CT_CUDA_PROFILE=1 NCCL_NVLS_ENABLE=0 "$LAUNCH" --nproc_per_node 2 --standalone $G "train.out_dir=$TMP/p2" >"$TMP/p2.log" 2>&1
  echo "== profile, ddp 2 GPUs (both ranks' stderr)"; grep -A40 "cuda op profile" "$TMP/p2.log"
fi
if [ -n "${MARKS:-}" ]; then
  CT_STEP_MARKS=1 "$CT" train $G "train.out_dir=$TMP/m1" >"$TMP/m1.log" 2>&1
  echo "== step marks, 1 GPU"; grep -A12 "step marks" "$TMP/m1.log"
  CT_STEP_MARKS=1 NCCL_NVLS_ENABLE=0 "$LAUNCH" --nproc_per_node 2 --standalone $G "train.out_dir=$TMP/m2" >"$TMP/m2.log" 2>&1
  echo "== step marks, ddp 2 GPUs"; grep -A12 "step marks" "$TMP/m2.log"
fi

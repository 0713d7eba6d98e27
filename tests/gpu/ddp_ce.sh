#!/usr/bin/env bash
# 2-GPU check of parallel.ce_allreduce (parallel/comm_ce.c): 10 ddp steps of the tiny gpt2 config
# with the gradient buckets all-reduced by the copy engines give the same losses as with NCCL's
# all-reduce: identical (2 ranks: both average as x/2 + y/2, rounded once; also checked within
# 1e-5 for fp32, 1e-2 for bf16 on the wire, the bound for more ranks); for fp32 and bf16 reduce_dtype and with the sparse embedding
# gradient (whose packed rows still go through NCCL). The log says every bucket went the ce way.
# Exits 77 with fewer than 2 CUDA devices.
source "$(dirname "$0")/../integration/lib.sh"
SRC=${CT_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
LAUNCH=$(dirname "$CTRAIN")/ctrain-launch
ngpu=$("$CTRAIN" env 2>/dev/null | grep -c '^  cuda:[0-9]')
if [ "$ngpu" -lt 2 ]; then echo "$ngpu CUDA device(s), 2 needed: skipped"; exit 77; fi
if [ -d /usr/share/games/fortunes ]; then make_data "$TMP/data"
else "$CTRAIN" prepare --out-dir "$TMP/data" /usr/lib/python3*/*.py >/dev/null 2>&1; fi
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
args=("$SRC/configs/smoke.toml" "data.train=$TMP/data/train.h5" "data.val=$TMP/data/val.h5"
      train.max_steps=10 train.eval_every=0 train.sample_tokens=0 train.precision=bf16
      train.warmup_steps=2 parallel.bucket_mb=0.25)
losses() { grep -o '"loss": [^,]*' "$1/metrics.jsonl" | tr '\n' ' '; }
for v in "fp32" "bf16" "fp32 sparse"; do
  set -- ${v}
  extra=("parallel.reduce_dtype=$1")
  [ "${2:-}" = sparse ] && extra+=(parallel.sparse_embedding_grad=true)
  tag=${v// /_}
  for ce in false true; do
    "$LAUNCH" --nproc_per_node 2 --standalone "${args[@]}" "${extra[@]}" "parallel.ce_allreduce=$ce" \
      "train.out_dir=$TMP/${tag}_$ce" >"$TMP/${tag}_$ce.log" 2>&1
    check "$v, ce_allreduce = $ce: trains (exit $?)" test -s "$TMP/${tag}_$ce/metrics.jsonl"
  done
  # "ddp: K of the N buckets went through the copy-engine all-reduce": all of them, but the
  # sparse embedding's packed rows (NCCL)
  kn=$(sed -n 's/.*ddp: \([0-9]*\) of the \([0-9]*\) buckets went through the copy-engine.*/\1 \2/p' \
       "$TMP/${tag}_true.log" | head -1)
  want_off=0; [ "${2:-}" = sparse ] && want_off=1
  check "$v: the buckets went through the copy engines (K of N: ${kn:-none})" \
    awk -v k="${kn% *}" -v n="${kn#* }" -v o=$want_off 'BEGIN{exit !(k > 1 && k + o == n)}'
  tol=1e-5; [ "$1" = bf16 ] && tol=1e-2
  check "$v: ce losses identical to NCCL's with 2 ranks ($(losses "$TMP/${tag}_true" | cut -c1-50)...)" \
    test -n "$(losses "$TMP/${tag}_true")" -a "$(losses "$TMP/${tag}_true")" = "$(losses "$TMP/${tag}_false")"
  check "$v: ce losses within $tol of NCCL's" close "$TMP/${tag}_false" "$TMP/${tag}_true" loss "$tol"
done
finish

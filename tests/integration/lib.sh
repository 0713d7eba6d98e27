# tests/integration/lib.sh — helpers for the whole-program tests (sourced).
# Each test gets a fresh temp dir (removed on exit) and counts checks; `finish` prints a
# summary and exits 1 if any check failed.
set -u
CTRAIN=${1:?usage: $0 PATH/TO/ctrain}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/ctrain-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
checks=0
failed=0

# expect_fail CODE PATTERN -- CMD...: CMD must exit with CODE and print PATTERN (grep -E) to stderr.
expect_fail() {
  local code=$1 pattern=$2
  shift 3
  local out rc
  out=$("$@" 2>&1 >/dev/null)
  rc=$?
  checks=$((checks + 1))
  if [ "$rc" -ne "$code" ] || ! grep -qE -- "$pattern" <<<"$out"; then
    failed=$((failed + 1))
    echo "FAIL: $* -> exit $rc (want $code), stderr:"
    echo "$out" | sed 's/^/    /'
    echo "    (wanted /$pattern/)"
  else
    echo "ok: exit $code, /$pattern/"
  fi
}

check() { # check DESCRIPTION COMMAND...
  local what=$1
  shift
  checks=$((checks + 1))
  if "$@"; then echo "ok: $what"; else failed=$((failed + 1)); echo "FAIL: $what"; fi
}

finish() {
  echo "$checks checks, $failed failed"
  [ "$failed" -eq 0 ]
  exit $?
}

# A small token corpus made by `ctrain prepare` from the fortunes package (or any text).
make_data() {
  local dir=$1
  if [ -d /usr/share/games/fortunes ]; then
    "$CTRAIN" prepare --out-dir "$dir" >/dev/null 2>&1
  else
    echo "fortunes package missing (scripts/install-deps.sh installs it)" >&2
    return 1
  fi
}

# Values of one metrics.jsonl field of a run directory, one per line.
field() { sed -n "s/.*\"$2\": \([0-9.e+-]*\).*/\1/p" "$1/metrics.jsonl" 2>/dev/null | grep -v '^$'; }

# close DIR_A DIR_B FIELD TOL [MIN_VALUES]: the two runs' FIELD values agree to a relative
# tolerance and there are at least MIN_VALUES of them (default $CLOSE_MIN, else 10). Both runs
# must have the same number of values: a line with one side missing (paste pads it with nothing,
# which awk's string compare turned into a relative difference of -inf) fails.
close() {
  paste -d' ' <(field "$1" "$3") <(field "$2" "$3") | awk -v tol="$4" -v min="${5:-${CLOSE_MIN:-10}}" '
    { n++; if (NF != 2) { missing++; next }
      d = $1 - $2; if (d < 0) d = -d; r = d / ($2 + 0 < 0 ? -$2 : $2 + 0); if (r > worst) worst = r }
    END { printf "  %s: %d values, worst relative difference %.2e (tolerance %s)%s\n", "'"$3"'", n, worst, tol,
                 missing ? ", " missing " without a counterpart" : "";
          exit !(n >= min && !missing && worst <= tol) }'
}

# The step lines of a run without timings: step, loss, lr, grad_norm (exact floats).
losses() { grep '"loss":' "$1/metrics.jsonl" | sed 's/, "tokens_per_s".*//'; }

# whole RUN_DIR: the path of a model.h5 with whole tensors for the run's latest checkpoint
# (a sharded one, model.h5 with weight_shards, goes through `ctrain consolidate` first)
whole() {
  local f=$1/ckpt/latest/model.h5
  if [ -f "$f" ] && h5dump -a /weight_shards "$f" >/dev/null 2>&1; then
    rm -rf "$1.whole"
    "$CTRAIN" consolidate "$1/ckpt/latest" "$1.whole" >/dev/null 2>&1 || return 1
    f=$1.whole/model.h5
  fi
  echo "$f"
}

# same_weights A B TOL: every dataset of the two runs' final model.h5 (whole tensors) within TOL
# (absolute); fails when either is missing or nothing was compared
same_weights() {
  local a b
  a=$(whole "$1") && b=$(whole "$2") || { echo "  consolidate failed"; return 1; }
  [ -f "$a" ] && [ -f "$b" ] || { echo "  missing checkpoint"; return 1; }
  h5diff -r -d 0 "$a" "$b" | awk -v tol="$3" '
    /^dataset:/ { ds = 1; sets++; next } /^attribute:/ { ds = 0; next }
    ds && /^\[/ { sub(/^\[[^]]*\]/, ""); d = $3; if (d < 0) d = -d; if (d > worst) worst = d }
    END { printf "  weights: %d tensors, worst absolute difference %.2e (tolerance %s)\n", sets, worst, tol;
          exit !(sets > 0 && worst <= tol) }'
}

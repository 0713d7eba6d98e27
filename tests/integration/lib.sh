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

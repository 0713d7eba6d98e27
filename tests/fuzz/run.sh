#!/usr/bin/env bash
# tests/fuzz/run.sh [BUILD_ROOT] — builds the libFuzzer harnesses of tests/fuzz/ with clang
# (ASan + UBSan, UB fatal), replays every kept input, then fuzzes each harness for a fixed time.
#
#   toml              common/toml.c: ct_toml_parse, then the first line as an override
#   safetensors       trainer/safetensors.c: ct_st_open on the input as a whole file
#   tokenizer_json    trainer/tokenizer.c: ct_tokenizer_load on the input as a tokenizer.json
#   tokenizer_encode  trainer/tokenizer.c: encode / decode / decode_stream on arbitrary bytes
#
# Binaries go to BUILD_ROOT/fuzz (meson passes its build root), else to a temporary directory.
# Phase 1 runs each file of regressions/<name>/ (inputs that once crashed, kept forever) and
# corpus/<name>/ (seeds) once, each in its own process so a leak names its input. Phase 2 fuzzes
# a temporary copy of corpus/<name>/ (the repository is never written) for FUZZ_SECONDS (default
# 20; 0 skips phase 2) with -rss_limit_mb=2048 -timeout=10, FUZZ_JOBS harnesses at a time
# (default: the number of CPUs). Any crash, leak, UB, timeout or OOM makes the script print the
# input's path and the sanitizer report and exit 1; a new crash input is left in the artifacts
# directory it names (BUILD_ROOT/fuzz/artifacts, else /tmp/ctrain-fuzz-artifacts; copy it into
# regressions/<name>/ once the bug is fixed).
#
# FUZZ_TARGETS narrows the set ("toml safetensors"); FUZZ_CC picks the compiler (default
# clang). Without a clang that can link -fsanitize=fuzzer (Debian: clang, libclang-rt-14-dev)
# the test is skipped (exit 77).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
CC=${FUZZ_CC:-clang}
SECONDS_EACH=${FUZZ_SECONDS:-20}
TARGETS=${FUZZ_TARGETS:-"toml safetensors tokenizer_json tokenizer_encode"}
JOBS=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 2)}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ctrain-fuzz.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if [ $# -ge 1 ] && [ -n "$1" ]; then out="$1/fuzz"; else out="$tmp/bin"; fi
mkdir -p "$out"
# crashing inputs are copied here, outside $tmp, so they outlive the run
keep_root="$out/artifacts"
[ "$out" != "$tmp/bin" ] || keep_root="${TMPDIR:-/tmp}/ctrain-fuzz-artifacts"

t_start=$(date +%s)
say() { echo "fuzz: $*"; }

# ---- toolchain check: skip, do not fail, where the fuzzer runtime is not installed
# shellcheck disable=SC2054  # -fsanitize takes a comma-separated list
CFLAGS=(-g -O1 -std=gnu11 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
        -Wall -Wno-unused-parameter -I"$root")
echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' >"$tmp/probe.c"
if ! command -v "$CC" >/dev/null ||
   ! "$CC" "${CFLAGS[@]}" "$tmp/probe.c" -o "$tmp/probe" 2>"$tmp/probe.log"; then
  say "SKIP: '$CC' cannot build libFuzzer harnesses (install clang and libclang-rt-14-dev:" \
      "scripts/install-deps.sh)"
  sed 's/^/  /' "$tmp/probe.log" 2>/dev/null | head -5 || true
  exit 77
fi

pc() { pkg-config "$@" 2>/dev/null || true; }
# tokenizer.c calls ct_byte_encode from trainer/data.c, which brings HDF5 along
DEPS=(libcjson libpcre2-8 libutf8proc hdf5)
CPPFLAGS=$(pc --cflags "${DEPS[@]}")
LIBS="$(pc --libs "${DEPS[@]}") -lpthread -lm"
sources() {
  case "$1" in
    toml) echo common/toml.c common/status.c common/util.c ;;
    safetensors) echo trainer/safetensors.c common/status.c common/util.c ;;
    tokenizer_json | tokenizer_encode)
      echo trainer/tokenizer.c trainer/data.c common/sha256.c common/status.c common/util.c ;;
    *) echo "unknown target $1" >&2; return 1 ;;
  esac
}

# ---- dictionaries (generated: tokens libFuzzer splices into inputs)
cat > "$tmp/toml.dict" <<'EOF'
"="
"["
"]"
"[["
"]]"
"{"
"}"
","
"."
"\""
"'"
"\"\"\""
"'''"
"#"
"\x0a"
"\x0d\x0a"
"\\u"
"\\U"
"\\"
"true"
"false"
"inf"
"nan"
"+inf"
"-nan"
"0x"
"0o"
"0b"
"1e"
"_"
"1979-05-27"
"T07:32:00"
"07:32:00.999"
"Z"
"+07:00"
"[model]"
"[[a.b]]"
"a.b.c"
"\"quoted key\""
EOF
cat > "$tmp/json.dict" <<'EOF'
"{"
"}"
"["
"]"
":"
","
"\""
"\\u"
"\\ud83d\\ude00"
"null"
"true"
"false"
"-1"
"1e308"
"9007199254740993"
"\"__metadata__\""
"\"dtype\""
"\"shape\""
"\"data_offsets\""
"\"F32\""
"\"F16\""
"\"BF16\""
"\"F64\""
"\"I64\""
"\"BOOL\""
"\"model\""
"\"type\""
"\"BPE\""
"\"vocab\""
"\"merges\""
"\"added_tokens\""
"\"normalizer\""
"\"pre_tokenizer\""
"\"decoder\""
"\"ByteLevel\""
"\"Split\""
"\"Sequence\""
"\"pretokenizers\""
"\"normalizers\""
"\"NFC\""
"\"NFKD\""
"\"Regex\""
"\"String\""
"\"pattern\""
"\"behavior\""
"\"Isolated\""
"\"invert\""
"\"use_regex\""
"\"add_prefix_space\""
"\"unk_token\""
"\"fuse_unk\""
"\"ignore_merges\""
"\"byte_fallback\""
"\"content\""
"\"id\""
"\"special\""
"\"single_word\""
"\"lstrip\""
"\"rstrip\""
"\"normalized\""
"\"<|endoftext|>\""
"\\p{L}"
"\\s+(?!\\S)"
"(?i:"
"\\Q"
"[[:alpha:]]"
EOF
dict_for() {
  case "$1" in
    toml) echo "$tmp/toml.dict" ;;
    safetensors | tokenizer_json) echo "$tmp/json.dict" ;;
    *) echo "" ;;
  esac
}

# ---- build: each source once (JOBS at a time), then one link per harness
mkdir -p "$out/obj"
all_src=$(for name in $TARGETS; do
            echo "tests/fuzz/fuzz_$name.c"
            sources "$name" | tr ' ' '\n'
          done | sort -u)
obj_of() { echo "$out/obj/$(echo "${1%.c}" | tr / _).o"; }
for src in $all_src; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
  # shellcheck disable=SC2086  # CPPFLAGS is a list
  (cd "$root" && "$CC" "${CFLAGS[@]}" $CPPFLAGS -c "$src" -o "$(obj_of "$src")" \
     >"$tmp/build.$(basename "$src").log" 2>&1 || echo "$src" >>"$tmp/build.failed") &
done
wait
cat "$tmp"/build.*.log # warnings too: these sources should build cleanly
if [ -s "$tmp/build.failed" ]; then
  say "FAIL: compiling $(tr '\n' ' ' <"$tmp/build.failed")"
  exit 1
fi
for name in $TARGETS; do
  objs=$(obj_of "tests/fuzz/fuzz_$name.c")
  for src in $(sources "$name"); do objs="$objs $(obj_of "$src")"; done
  # shellcheck disable=SC2086  # object and library lists
  "$CC" "${CFLAGS[@]}" $objs $LIBS -o "$out/fuzz_$name" ||
    { say "FAIL: linking fuzz_$name"; exit 1; }
done
t_built=$(date +%s)
say "built $(echo "$TARGETS" | wc -w) harnesses in $out ($((t_built - t_start)) s)"

export CT_SOURCE_ROOT="$root"
# UBSan: print a stack and abort, so libFuzzer records the input
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
LIMITS=(-rss_limit_mb=2048 -timeout=10)
failed=0

# ---- phase 1: every kept input once, one process each
for name in $TARGETS; do
  n=0
  for dir in "$here/regressions/$name" "$here/corpus/$name"; do
    [ -d "$dir" ] || continue
    for f in "$dir"/*; do
      [ -f "$f" ] || continue
      n=$((n + 1))
      if ! "$out/fuzz_$name" "${LIMITS[@]}" "$f" >"$tmp/replay.log" 2>&1; then
        say "FAIL: fuzz_$name crashes on ${f#"$root"/}"
        cat "$tmp/replay.log"
        failed=1
      fi
    done
  done
  say "replayed $n inputs through fuzz_$name"
done
[ "$failed" -eq 0 ] || { say "FAILED (replay)"; exit 1; }
if [ "$SECONDS_EACH" -le 0 ]; then
  say "OK (no fuzzing: FUZZ_SECONDS=0) in $(($(date +%s) - t_start)) s"
  exit 0
fi

# ---- phase 2: fuzz a copy of each seed corpus
fuzz_one() {
  local name=$1 corpus="$tmp/corpus/$1" art="$tmp/artifacts/$1/" dict
  mkdir -p "$corpus" "$art"
  [ -d "$here/corpus/$name" ] && cp -r "$here/corpus/$name/." "$corpus/"
  [ -d "$here/regressions/$name" ] && cp -r "$here/regressions/$name/." "$corpus/"
  dict=$(dict_for "$name")
  "$out/fuzz_$name" "${LIMITS[@]}" -max_total_time="$SECONDS_EACH" -print_final_stats=1 \
    ${dict:+-dict="$dict"} -artifact_prefix="$art" "$corpus" >"$tmp/$name.log" 2>&1 ||
    echo $? >"$tmp/$name.rc"
}
for name in $TARGETS; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
  fuzz_one "$name" &
done
wait
for name in $TARGETS; do
  rc=$(cat "$tmp/$name.rc" 2>/dev/null || echo 0)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$tmp/$name.log" | tail -1)
  if [ "$rc" -ne 0 ]; then
    failed=1
    # keep the crashing inputs past the temporary directory's removal
    keep="$keep_root/$name"
    rm -rf "$keep" && mkdir -p "$keep"
    cp "$tmp/artifacts/$name/"* "$keep/" 2>/dev/null || true
    say "FAIL: fuzz_$name (exit $rc); crashing input(s):"
    for a in "$keep"/*; do [ -f "$a" ] && echo "  $a"; done
    echo "---- fuzz_$name log (tail)"
    tail -n 80 "$tmp/$name.log"
    echo "----"
  else
    say "fuzz_$name: ${execs:-?} executions in ${SECONDS_EACH} s, no crash"
  fi
done
say "$([ "$failed" -eq 0 ] && echo OK || echo FAILED) in $(($(date +%s) - t_start)) s"
exit "$failed"

#!/usr/bin/env bash
# Bad input gets a clear message naming the file/key/value and exit code 2; nothing already
# written is lost.
source "$(dirname "$0")/lib.sh"
SRC=${CT_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}

make_data "$TMP/data" || exit 1
base=("$CTRAIN" train "$SRC/configs/smoke.toml" "data.train=$TMP/data/train.h5"
      "data.val=$TMP/data/val.h5" "train.out_dir=$TMP/run" train.max_steps=2)

# usage
expect_fail 2 'unknown command "trian"' -- "$CTRAIN" trian
expect_fail 2 'missing CONFIG.toml' -- "$CTRAIN" train
expect_fail 2 'no-such\.toml: cannot open' -- "$CTRAIN" train "$TMP/no-such.toml"
# unknown key with a suggestion, from a file (with line:column) and from an override
printf '[model]\nn_layers = 2\n' >"$TMP/unknown.toml"
expect_fail 2 'unknown\.toml:2:1: model\.n_layers: unknown key; did you mean model\.n_layer\?' -- \
  "$CTRAIN" train "$TMP/unknown.toml"
expect_fail 2 'model\.n_layers: unknown key; did you mean model\.n_layer\?' -- "${base[@]}" model.n_layers=2
expect_fail 2 '\[modle\]: unknown section' -- "${base[@]}" modle.n_layer=2
# kernel registry: unavailable attention implementations and unknown variants name the valid ones
if "$CTRAIN" env | grep -q 'cudnn: not in this build'; then
  expect_fail 2 'no cuDNN attention .*available: auto, sdpa, eager, flash' -- "${base[@]}" attention.implementation=cudnn
else # built with cuDNN attention: on the CPU it is still not available
  CUDA_VISIBLE_DEVICES= expect_fail 2 '"cudnn" is a CUDA kernel; on the CPU the available implementations are auto, sdpa and eager' -- "${base[@]}" attention.implementation=cudnn
fi
expect_fail 2 'on the CPU the available implementations are auto, sdpa and eager' -- "${base[@]}" attention.implementation=flash
expect_fail 2 "kernels.cuda.train.norm_bwd: unknown variant 'fast' \\(valid: fused, twopass\\)" -- "${base[@]}" kernels.cuda.train.norm_bwd=fast
# wrong type
printf '[train]\nlr = "fast"\n' >"$TMP/type.toml"
expect_fail 2 'type\.toml:2:6: train\.lr: expected a number, got string' -- "$CTRAIN" train "$TMP/type.toml"
expect_fail 2 'train\.micro_batch: expected an integer, got float' -- "${base[@]}" train.micro_batch=1.5
# bad enum
expect_fail 2 'train\.schedule: "cosin" is not one of constant\|linear\|cosine\|wsd' -- "${base[@]}" train.schedule=cosin
# malformed TOML, with line:column
printf '[model]\nn_layer = 2\nn_head = [1, 2\n' >"$TMP/bad.toml"
expect_fail 2 'bad\.toml:[0-9]+:[0-9]+: ' -- "$CTRAIN" train "$TMP/bad.toml"
printf '[train]\nlr = 3e-4 x\n' >"$TMP/garbage.toml"
expect_fail 2 'garbage\.toml:2:[0-9]+: ' -- "$CTRAIN" train "$TMP/garbage.toml"
# inconsistent dimensions
expect_fail 2 'model\.d_model = 100 is not divisible by model\.n_head = 3' -- "${base[@]}" model.d_model=100 model.n_head=3
expect_fail 2 'model\.n_head = 4 is not divisible by model\.n_kv_head = 3' -- "${base[@]}" model.arch=llama model.n_kv_head=3
expect_fail 2 'train\.seq_len = 512 exceeds model\.max_seq_len = 128' -- "${base[@]}" train.seq_len=512
expect_fail 2 'train\.micro_batch = 0: must be positive' -- "${base[@]}" train.micro_batch=0
expect_fail 2 'qk_norm' -- "${base[@]}" model.qk_norm=true
# missing data file
expect_fail 2 "$TMP/nowhere/train\\.h5" -- "${base[@]}" "data.train=$TMP/nowhere/train.h5"
# data whose token ids do not fit the model's vocabulary
expect_fail 2 'vocab' -- "${base[@]}" model.vocab_size=200
# a tokenizer that does not match the data
expect_fail 2 'tokenizer' -- "${base[@]}" data.tokenizer=gpt2
# generate: missing checkpoint, bad flags
expect_fail 2 'no checkpoint found' -- "$CTRAIN" generate --model "$TMP/none"
expect_fail 2 'unknown argument --tempreature' -- "$CTRAIN" generate --model x --tempreature 1
expect_fail 2 'expected lt-first, lt or gemmex' -- "$CTRAIN" generate --model x --matmul fast
# prepare: missing inputs
expect_fail 2 "$TMP/missing\\.txt" -- "$CTRAIN" prepare --out-dir "$TMP/d2" "$TMP/missing.txt"

# nothing already saved is lost: a good run, then a bad one into the same out_dir
"${base[@]}" >/dev/null 2>&1
check "good run wrote a checkpoint" test -f "$TMP/run/ckpt/latest/model.h5"
before=$(md5sum "$TMP/run/ckpt/latest/model.h5" "$TMP/run/metrics.jsonl")
expect_fail 2 'did you mean' -- "${base[@]}" train.lrr=1
after=$(md5sum "$TMP/run/ckpt/latest/model.h5" "$TMP/run/metrics.jsonl")
check "a rejected run leaves the earlier outputs untouched" test "$before" = "$after"
finish

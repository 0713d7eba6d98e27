#!/usr/bin/env bash
# ctrain generate / env on the CPU backend: bad --device_map, --max_memory (misspelt or asking for a GPU), --cuda_graphs,
# --batch and --stop values fail with a message and exit 2; a --stop string ends generation
# where its text appears; --batch 1,2 runs both batch sizes in one process (same first
# sequence); `env --model` prints the placement; `eval` gives the trainer's validation loss.
source "$(dirname "$0")/lib.sh"
SRC=${CT_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
M=$SRC/tests/fixtures/hf/gpt2
export CUDA_VISIBLE_DEVICES=
expect_fail 2 "device_map fast: expected auto, balanced, sequential or cuda:N" -- "$CTRAIN" env --model "$M" --device_map fast
expect_fail 2 "need a CUDA device" -- "$CTRAIN" generate --model "$M" --device_map balanced
expect_fail 2 "need a CUDA device" -- "$CTRAIN" generate --model "$M" --max_memory 0=1GiB
expect_fail 2 "generate: --device_map cuda:0 and --max_memory 0=2GiB: device maps need a CUDA device" -- "$CTRAIN" generate --model "$M" --device_map cuda:0 --max_memory 0=2GiB
# a misspelt budget is named as such even where no GPU is (not "no CUDA device")
expect_fail 2 "max_memory 0=20XB: expected DEVICE=SIZE" -- "$CTRAIN" generate --model "$M" --max_memory 0=20XB
expect_fail 2 "max_memory 1GiB: expected DEVICE=SIZE" -- "$CTRAIN" env --model "$M" --max_memory 1GiB
expect_fail 2 "cuda_graphs sometimes: expected auto, on or off" -- "$CTRAIN" generate --model "$M" --cuda_graphs sometimes
expect_fail 2 "batch 0: expected B or B1,B2" -- "$CTRAIN" generate --model "$M" --batch 0
expect_fail 2 "batch 1,,2: expected B or B1,B2" -- "$CTRAIN" generate --model "$M" --batch 1,,2
# numbers are read whole (atoi took "abc" for 0 and "-1" for a temperature)
expect_fail 2 "max_new_tokens abc: expected an integer >= 0" -- "$CTRAIN" generate --model "$M" --max_new_tokens abc
expect_fail 2 "temperature -1: expected a number >= 0" -- "$CTRAIN" generate --model "$M" --temperature -1
expect_fail 2 "top_k 5x: expected an integer >= 0" -- "$CTRAIN" generate --model "$M" --top_k 5x
expect_fail 2 "top_p 1.2: expected a number in \\(0, 1\\]" -- "$CTRAIN" generate --model "$M" --top_p 1.2
expect_fail 2 "seed -5: expected an integer >= 0" -- "$CTRAIN" generate --model "$M" --seed -5
expect_fail 2 "eval: --batch 0: expected an integer >= 1" -- "$CTRAIN" eval --model "$M" --data x.h5 --batch 0
expect_fail 2 "env: --max_len q: expected an integer >= 0" -- "$CTRAIN" env --model "$M" --max_len q
expect_fail 2 "stop needs a non-empty string" -- "$CTRAIN" generate --model "$M" --stop ""
expect_fail 2 "CUDA graphs: backend cpu has none" -- "$CTRAIN" generate --model "$M" --cuda_graphs on
check "env --model prints the placement" bash -c "'$CTRAIN' env --model '$M' | grep -q 'placement of .*all 2 layers'"
full=$("$CTRAIN" generate --model "$M" --prompt "The" --max_new_tokens 30 --greedy 2>/dev/null)
stop=$(cut -c 9-10 <<<"$full") # two characters the model writes after a few tokens
cut=$("$CTRAIN" generate --model "$M" --prompt "The" --max_new_tokens 30 --greedy --stop "$stop" 2>/dev/null)
check "--stop ends generation once its text appears" bash -c "[ \${#1} -lt \${#2} ] && [[ \$1 == *\"\$3\"* ]] && [[ \$2 == \"\${1%\$'\n'}\"* ]]" _ "$cut" "$full" "$stop"
ids=$("$CTRAIN" generate --model "$M" --prompt_ids 5 --batch 1,2 --max_new_tokens 6 --greedy --ignore_eos --print_ids 2>/dev/null)
check "--batch 1,2 runs both (3 sequences printed)" test "$(grep -c '^=== sequence' <<<"$ids")" -eq 3
check "... and sequence 0 is the same in both" test "$(sed -n 2p <<<"$ids")" = "$(sed -n 4p <<<"$ids")"
# eval through the inference engine == the trainer's validation loss on the same windows
# (smoke config: eval_steps 20 x micro_batch 16 windows of 128 tokens from the start of val.h5)
if make_data "$TMP/data"; then
  val=$("$CTRAIN" train "$SRC/configs/smoke.toml" "data.train=$TMP/data/train.h5" \
        "data.val=$TMP/data/val.h5" train.max_steps=4 train.eval_every=4 train.sample_tokens=0 \
        "train.out_dir=$TMP/run" 2>/dev/null | sed -n 's/^final val_loss \([0-9.]*\)$/\1/p')
  ev=$("$CTRAIN" eval --model "$TMP/run/ckpt/latest" --data "$TMP/data/val.h5" --batch 16 \
       --max_batches 20 2>/dev/null | sed -n 's/^eval: .* loss \([0-9.]*\), .*/\1/p')
  check "eval loss $ev = the trainer's val_loss $val" \
    awk -v a="$ev" -v b="$val" 'BEGIN{d = a - b; if (d < 0) d = -d; exit !(a > 0 && d < 6e-5)}'
  expect_fail 2 "eval: --model and --data are required" -- "$CTRAIN" eval --model "$TMP/run/ckpt/latest"
fi
finish

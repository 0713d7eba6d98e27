#!/usr/bin/env bash
# GPU suite: generation on the GPU. Greedy generate on the GPU (fp32) gives the CPU backend's
# text for the tiny HF fixtures; CUDA-graph decode equals non-graph decode token for token
# (bf16 and fp32); a batch of prompts of different lengths gives each prompt's solo tokens
# (greedy and sampled); decoding ahead (CT_DECODE_AHEAD) equals step-by-step decoding, with
# and without --stop; --device_map balanced / sequential (--max_memory) over 2 GPUs (with one
# GPU, over 2 devices on it: CT_CUDA_VIRTUAL_DEVICES=2) equal one device; bad --device_map /
# --max_memory input fails with a message. Usage:
#   generate_gpu.sh CTRAIN [FIXTURES_DIR]      (exits 77 without a CUDA device; FIXTURES="qwen3"
#   limits the models)
source "$(dirname "$0")/../integration/lib.sh"
SRC=${CT_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
FIX=${2:-$SRC/tests/fixtures/hf}
if ! "$CTRAIN" env 2>/dev/null | grep -q '^  cuda:0'; then echo "no CUDA device: skipped"; exit 77; fi
ngpu=$("$CTRAIN" env 2>/dev/null | grep -c '^  cuda:')
gen() { "$CTRAIN" generate --model "$FIX/$1" --max_new_tokens 24 "${@:2}" 2>>"$TMP/log"; }
same() { [ -n "$1" ] && [ "$1" = "$2" ]; }
P=(--prompt "The" --prompt "Once upon a time there was a" --prompt "A b")

for m in ${FIXTURES:-gpt2 llama_gqa qwen3 qwen2}; do
  g=$(gen $m --prompt "The" --greedy --precision fp32 | od -An -tx1 | tr -d ' \n')
  c=$(CUDA_VISIBLE_DEVICES= gen $m --prompt "The" --greedy | od -An -tx1 | tr -d ' \n')
  check "$m: greedy on the GPU (fp32) = CPU backend" same "$g" "$c"
  for p in bf16 fp32; do
    on=$(gen $m "${P[@]}" --greedy --precision $p --print_ids --cuda_graphs on)
    off=$(gen $m "${P[@]}" --greedy --precision $p --print_ids --cuda_graphs off)
    check "$m $p: CUDA-graph decode = non-graph decode" same "$on" "$off"
  done
  # decoding ahead (the default on one GPU: each step queued before the host has read the one
  # before) against decoding step by step, for rows that stop at different steps
  for p in bf16 fp32; do
    on=$(gen $m "${P[@]}" --greedy --precision $p --print_ids --max_new_tokens 40)
    a_on=$(grep '^stats:' "$TMP/log" | tail -1 | sed -n 's/.*ahead_steps=\([0-9]*\).*/\1/p')
    off=$(CT_DECODE_AHEAD=0 gen $m "${P[@]}" --greedy --precision $p --print_ids --max_new_tokens 40)
    a_off=$(grep '^stats:' "$TMP/log" | tail -1 | sed -n 's/.*ahead_steps=\([0-9]*\).*/\1/p')
    check "$m $p: the default run decoded ahead (ahead_steps ${a_on:-none} > 0), CT_DECODE_AHEAD=0 did not (${a_off:-none})" \
      test "${a_on:-0}" -gt 0 -a "${a_off:-1}" -eq 0
    check "$m $p: decoding ahead = step by step (3 mixed-length prompts)" same "$on" "$off"
    w=$(CT_DECODE_AHEAD=0 gen $m --prompt "Once upon a time" --greedy --precision $p --max_new_tokens 12 | tail -c 4)
    if [ -n "$w" ]; then
      on=$(gen $m "${P[@]}" --greedy --precision $p --print_ids --stop "$w")
      off=$(CT_DECODE_AHEAD=0 gen $m "${P[@]}" --greedy --precision $p --print_ids --stop "$w")
      check "$m $p: decoding ahead = step by step with --stop" same "$on" "$off"
    fi
  done
  for opt in "--greedy" "--temperature 1 --top_k 20 --seed 5"; do
    batch=$(gen $m "${P[@]}" $opt --print_ids --precision fp32 | grep -v '^===')
    solo=""
    for i in 0 1 2; do
      s=$(gen $m --prompt "${P[$((2 * i + 1))]}" $opt --print_ids --precision fp32 |
          grep -v '^===')
      solo+="$s"$'\n'
    done
    # sequence i of a batch samples from stream seed + i: compare greedy exactly, sampled
    # sequence 0 (same stream alone and in the batch)
    if [ "$opt" = "--greedy" ]; then
      check "$m: batch of 3 mixed-length prompts = one by one (greedy)" same "$batch" "${solo%$'\n'}"
    else
      check "$m: batch member 0 = its solo run (sampled)" same "$(head -1 <<<"$batch")" "$(head -1 <<<"$solo")"
    fi
  done
  # across devices: two GPUs, or with one GPU two devices on it (CT_CUDA_VIRTUAL_DEVICES=2:
  # each with its own stream, handles, weights, caches and graphs, the hidden states copied
  # between them), which runs the same multi-device path
  if [ "$ngpu" -ge 2 ]; then where="2 GPUs"; virt=""; else where="2 devices on one GPU"; virt=2; fi
  one=$(CT_CUDA_VIRTUAL_DEVICES=$virt gen $m "${P[@]}" --greedy --print_ids --device_map cuda:0)
  two=$(CT_CUDA_VIRTUAL_DEVICES=$virt gen $m "${P[@]}" --greedy --print_ids --device_map balanced)
  check "$m: --device_map balanced over $where = one device" same "$one" "$two"
  check "$m: the log shows layers on cuda:0 and cuda:1" grep -q "cuda:1 layers 1-1" "$TMP/log"
  one32=$(CT_CUDA_VIRTUAL_DEVICES=$virt gen $m "${P[@]}" --greedy --print_ids --precision fp32 --device_map cuda:1)
  two32=$(CT_CUDA_VIRTUAL_DEVICES=$virt gen $m "${P[@]}" --greedy --print_ids --precision fp32 --device_map balanced)
  check "$m: fp32 balanced over $where = cuda:1 alone" same "$one32" "$two32"
  seq=$(CT_CUDA_VIRTUAL_DEVICES=$virt gen $m "${P[@]}" --greedy --print_ids --device_map sequential --max_memory 0=1MiB,1=40GiB)
  check "$m: sequential with no room on cuda:0 (--max_memory, $where) runs on cuda:1" same "$one" "$seq"
  check "$m: ... and says so" grep -q "device_map sequential: cuda:1 layers 0-1" "$TMP/log"
done
if [ "$ngpu" -lt 2 ]; then echo "only $ngpu GPU: device_map checked over 2 devices on it, not across GPUs"; fi
expect_fail 2 "device_map fast: expected auto, balanced" -- "$CTRAIN" generate --model "$FIX/gpt2" --device_map fast
expect_fail 2 "max_memory 0=lots: expected DEVICE=SIZE" -- "$CTRAIN" generate --model "$FIX/gpt2" --max_memory 0=lots
expect_fail 2 "device 9 is not visible" -- "$CTRAIN" generate --model "$FIX/gpt2" --max_memory 9=1GiB
expect_fail 2 "cuda_graphs maybe: expected auto, on or off" -- "$CTRAIN" generate --model "$FIX/gpt2" --cuda_graphs maybe
expect_fail 1 "does not fit: cuda:0 needs" -- "$CTRAIN" generate --model "$FIX/gpt2" --device_map cuda:0 --max_memory 0=1MiB
finish

/* trainer/generate.h — autoregressive sampling with a KV cache: each prompt is prefilled in
 * one forward, then every step feeds one new token per sequence (O(T) per token). A batch of
 * prompts of different lengths needs no padding: each sequence has its own cache length.
 * Generation stops at max_new_tokens, at stop_id, or when the context (model.max_seq_len) is
 * full. (CUDA graphs and device_map come with the GPU inference issue.) */
#ifndef CT_GENERATE_H
#define CT_GENERATE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "trainer/model.h"

typedef struct ct_sample_cfg {
  int max_new_tokens;
  float temperature;   /* <= 0 means greedy */
  int top_k;           /* 0 = off */
  float top_p;         /* 1 = off */
  uint64_t seed;
  int stop_id;         /* stop after sampling this id (-1 = never) */
} ct_sample_cfg;
#define CT_SAMPLE_INIT {64, 1.0f, 0, 1.0f, 1337, -1}

typedef void (*ct_token_cb)(int seq, int32_t id, void *user);

/* Generates for n_seq prompts together. outs[i] (capacity >= max_new_tokens) receives the new
 * ids of prompt i and n_outs[i] their count. on_token (may be NULL) is called for every token
 * as it is produced (streaming), with the prompt's index. Sequence i samples from the stream
 * (seed + i, token index), so results do not depend on the batch composition. An empty prompt
 * starts from stop_id (end-of-text) when there is one. */
ct_status ct_generate_batch(ct_model *m, int n_seq, const int32_t *const *prompts,
                            const int *prompt_lens, const ct_sample_cfg *s, int32_t **outs,
                            int *n_outs, ct_token_cb on_token, void *user);

/* One prompt (see ct_generate_batch). */
ct_status ct_generate(ct_model *m, const int32_t *prompt, int n_prompt, const ct_sample_cfg *s,
                      int32_t *out, int *n_out, ct_token_cb on_token, void *user);

/* Picks one id from logits[0..V) (pure function of logits, settings and rng; exposed for tests). */
int32_t ct_sample_logits(const float *logits, int V, const ct_sample_cfg *s, uint64_t seed,
                         uint64_t counter);

/* `ctrain generate --model PATH --prompt TEXT [--max_new_tokens N] [--temperature T]
 *  [--top_k K] [--top_p P] [--seed S] [--greedy]` */
ct_status ct_cmd_generate(int argc, char **argv);

#endif

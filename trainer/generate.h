/* trainer/generate.h — autoregressive sampling with a KV cache through the batched inference
 * engine (trainer/model.h, ct_infer): prompts are prefilled (prompts of equal length together,
 * in one forward), then every step decodes one new token of EVERY running sequence in one
 * forward (O(T) per token, a CUDA graph per batch size on the GPU). Prompts of different
 * lengths need no padding: each sequence has its own cache length and position. Generation
 * stops at max_new_tokens, at stop_id, at a stop string (should_stop), or when the context
 * (model.max_seq_len) is full. */
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
  /* Optional: called after each token of sequence seq (its ids so far, n of them); true ends
   * the sequence there (stop strings). */
  bool (*should_stop)(int seq, const int32_t *ids, int n, void *user);
  void *stop_user;
} ct_sample_cfg;
#define CT_SAMPLE_INIT {64, 1.0f, 0, 1.0f, 1337, -1, NULL, NULL}

/* Timings of one generation: prefill (every prompt to its first token: the time to first
 * token), then the decode steps (one batched forward each). */
typedef struct ct_gen_stats {
  double ttft_s, decode_s;
  long prompt_tokens, decode_tokens, decode_steps, graph_steps, ahead_steps;
} ct_gen_stats;

typedef void (*ct_token_cb)(int seq, int32_t id, void *user);

/* Generates for n_seq prompts together. outs[i] (capacity >= max_new_tokens) receives the new
 * ids of prompt i and n_outs[i] their count. on_token (may be NULL) is called for every token
 * as it is produced (streaming), with the prompt's index. Sequence i samples from the stream
 * (seed + i, token index), so results do not depend on the batch composition. An empty prompt
 * starts from stop_id (end-of-text) when there is one. */
ct_status ct_generate_batch(ct_model *m, int n_seq, const int32_t *const *prompts,
                            const int *prompt_lens, const ct_sample_cfg *s, int32_t **outs,
                            int *n_outs, ct_token_cb on_token, void *user);

/* ct_generate_batch on an existing inference engine (trainer/model.h: device map, CUDA graphs);
 * n_seq <= its max_seqs, prompt + max_new_tokens within its capacity (longer generations stop
 * when a sequence's cache is full). Every slot is reset first. stats may be NULL. */
ct_status ct_generate_infer(ct_infer *e, int n_seq, const int32_t *const *prompts,
                            const int *prompt_lens, const ct_sample_cfg *s, int32_t **outs,
                            int *n_outs, ct_token_cb on_token, void *user, ct_gen_stats *stats);

/* One prompt (see ct_generate_batch). */
ct_status ct_generate(ct_model *m, const int32_t *prompt, int n_prompt, const ct_sample_cfg *s,
                      int32_t *out, int *n_out, ct_token_cb on_token, void *user);

/* Picks one id from logits[0..V) (pure function of logits, settings and rng; exposed for tests). */
int32_t ct_sample_logits(const float *logits, int V, const ct_sample_cfg *s, uint64_t seed,
                         uint64_t counter);

/* `ctrain generate --model PATH --prompt TEXT [--max_new_tokens N] [--temperature T]
 *  [--top_k K] [--top_p P] [--seed S] [--greedy]` */
ct_status ct_cmd_generate(int argc, char **argv);

/* `ctrain env [--model PATH [--device_map SPEC] [--max_memory SPEC] [--batch B] [--max_len N]
 *  [--precision P]]`: devices and libraries, then the model's placement over the GPUs. */
ct_status ct_cmd_env(int argc, char **argv);

/* `ctrain eval --model PATH --data FILE.h5 [--seq_len T] [--batch B] [--max_batches N]
 *  [--device_map SPEC] [--max_memory SPEC] [--precision P]`: loss and perplexity through the
 * inference engine (across GPUs with a device map). */
ct_status ct_cmd_eval(int argc, char **argv);

#endif

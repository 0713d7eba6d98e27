/* trainer/generate.h — autoregressive sampling (CPU reference; the GPU path with a KV cache
 * and CUDA graphs comes with the inference issue). Each new token reruns the forward over the
 * last max_T tokens: O(T^2) per token, fine for samples of a few hundred tokens. */
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

typedef void (*ct_token_cb)(int32_t id, void *user);

/* Appends up to max_new_tokens ids to `out` (capacity >= max_new_tokens); *n_out receives the
 * count. `on_token` (may be NULL) is called for each as it is produced (streaming). */
ct_status ct_generate(ct_model *m, const int32_t *prompt, int n_prompt, const ct_sample_cfg *s,
                      int32_t *out, int *n_out, ct_token_cb on_token, void *user);

/* Picks one id from logits[0..V) (pure function of logits, settings and rng; exposed for tests). */
int32_t ct_sample_logits(const float *logits, int V, const ct_sample_cfg *s, uint64_t seed,
                         uint64_t counter);

/* `ctrain generate --model PATH --prompt TEXT [--max_new_tokens N] [--temperature T]
 *  [--top_k K] [--top_p P] [--seed S] [--greedy]` */
ct_status ct_cmd_generate(int argc, char **argv);

#endif

/* tests/unit/tiny_model.h — the small random model the generation tests run on the CPU: d 32,
 * 4 heads, vocabulary 50 (padded to 64), max_seq_len T; for "llama" GQA (2 kv heads), qk_norm
 * and an untied head. init_std 0.3 makes the distributions peaked, so greedy is not a coin flip.
 * Exits with the last error when the config or the model cannot be made. */
#ifndef CT_TINY_MODEL_H
#define CT_TINY_MODEL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "kernels/ops.h"
#include "trainer/config.h"
#include "trainer/model.h"

static inline ct_model *tiny_model(const char *arch, int n_layer, int T, uint64_t seed) {
  ct_config c;
  ct_config_defaults(&c);
  snprintf(c.model.arch, sizeof c.model.arch, "%s", arch);
  c.model.n_layer = n_layer;
  c.model.d_model = 32;
  c.model.n_head = 4;
  c.model.vocab_size = 50;
  c.model.vocab_pad = 16;
  c.model.max_seq_len = T;
  c.train.seq_len = T;
  c.model.init_std = 0.3;
  if (!strcmp(arch, "llama")) {
    c.model.n_kv_head = 2;
    c.model.qk_norm = true;
    c.model.tie_embeddings = false;
  }
  ct_model *m = NULL;
  if (ct_config_validate(&c) != CT_OK ||
      ct_model_create(&c.model, ct_ops_cpu(), 1, T, &m) != CT_OK) {
    fprintf(stderr, "tiny_model(%s, %d layers): %s\n", arch, n_layer, ct_last_error());
    exit(1);
  }
  ct_model_init_weights(m, seed);
  return m;
}

#endif

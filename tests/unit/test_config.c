/* Config loading: defaults, file + overrides, derived values, every validation rule, error
 * messages with FILE:LINE:COL and suggestions, and the TOML round trip used by checkpoints. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ct_build_config.h"
#include "ct_test.h"
#include "trainer/config.h"

static char dir[256];

static const char *write_cfg(const char *name, const char *text) {
  static char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  fputs(text, f);
  fclose(f);
  return path;
}

/* Loads `text` with overrides and expects failure whose message contains `want`. */
static void expect_error(const char *text, const char *override, ct_status want_status,
                         const char *want) {
  ct_config c;
  char *ov[1] = {(char *)override};
  const char *path = write_cfg("e.toml", text);
  ct_status st = ct_config_load(path, override ? 1 : 0, ov, &c);
  CHECK_MSG(st == want_status, "status %d for %s / %s", st, text, override ? override : "");
  CHECK_MSG(strstr(ct_last_error(), want) != NULL, "message \"%s\" lacks \"%s\"", ct_last_error(), want);
}

int main(void) {
  snprintf(dir, sizeof dir, "%s/ct_config_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }

  /* defaults + derived values */
  ct_config c;
  CHECK(ct_config_load(NULL, 0, NULL, &c) == CT_OK);
  CHECK(!strcmp(c.model.arch, "gpt2"));
  CHECK(c.model.n_kv_head == c.model.n_head);
  CHECK(c.model.head_dim == c.model.d_model / c.model.n_head);
  CHECK(c.model.d_ff == 4 * c.model.d_model);
  CHECK(c.model.norm_eps == 1e-5);
  CHECK(!strcmp(c.train.out_dir, "runs/default"));
  CHECK(!c.parallel.sparse_embedding_grad); /* ddp's sparse embedding gradient is off by default */
  CHECK(!c.parallel.ce_allreduce); /* the copy-engine all-reduce is opt-in */

  /* a file, then overrides in order (later wins), ints accepted for floats */
  const char *p = write_cfg("run1.toml",
      "# comment\n[model]\narch = \"llama\"\nn_layer = 3\nn_head = 8\nn_kv_head = 2\n"
      "d_model = 256\nqk_norm = true\ntie_embeddings = false\n[train]\nlr = 1\nschedule = \"wsd\"\n"
      "seed = 42\n");
  char *ov[] = {"train.lr=3e-4", "model.n_layer=5", "train.schedule=linear", "train.lr=2e-4",
                "data.train=some/where.h5"};
  CHECK(ct_config_load(p, 5, ov, &c) == CT_OK);
  CHECK(!strcmp(c.model.arch, "llama"));
  CHECK(c.model.n_layer == 5);
  CHECK(c.model.n_kv_head == 2);
  CHECK(c.model.head_dim == 32);
  CHECK(c.model.d_ff == (8 * 256 / 3 + 63) / 64 * 64);
  CHECK(c.model.norm_eps == 1e-6);
  CHECK(c.model.qk_norm && !c.model.tie_embeddings);
  CHECK(c.train.lr == 2e-4);
  CHECK(!strcmp(c.train.schedule, "linear"));
  CHECK(c.train.seed == 42);
  CHECK(!strcmp(c.data.train, "some/where.h5"));
  CHECK(!strcmp(c.name, "run1"));
  CHECK(!strcmp(c.train.out_dir, "runs/run1"));

  /* explicit head_dim lets d_model be indivisible (Qwen3-0.6B: d=1024, 16 heads x 128) */
  p = write_cfg("q.toml", "[model]\narch=\"llama\"\nd_model=1024\nn_head=16\nn_kv_head=8\nhead_dim=128\n");
  CHECK(ct_config_load(p, 0, NULL, &c) == CT_OK);
  CHECK(c.model.head_dim == 128);

  /* [attention] and [kernels]: entries by device.mode.op, overrides replace, round trip below */
  p = write_cfg("k.toml", "[attention]\nimplementation = \"eager\"\n[kernels]\nuse_kernels = false\n"
                "cuda.train.attention = \"flash\"\ncuda.eval.xent = \"rowloop\"\n");
  char *kov[] = {"kernels.cuda.train.attention=eager", "kernels.cpu.eval.matmul=blas"};
  CHECK(ct_config_load(p, 2, kov, &c) == CT_OK);
  CHECK(!strcmp(c.kernels.attention, "eager") && !c.kernels.use_kernels);
  CHECK_MSG(c.kernels.n == 3, "%d kernel entries", c.kernels.n);
  CHECK(!strcmp(c.kernels.entries[0].op, "attention") && !strcmp(c.kernels.entries[0].variant, "eager"));
  CHECK(!strcmp(c.kernels.entries[1].mode, "eval") && !strcmp(c.kernels.entries[1].variant, "rowloop"));
  {
    char *kt = ct_config_to_toml(&c);
    ct_config kb;
    CHECK(kt && ct_config_from_toml_text(kt, "kt", &kb) == CT_OK);
    CHECK(kb.kernels.n == 3 && !memcmp(&kb.kernels, &c.kernels, sizeof c.kernels));
    free(kt);
    /* resolution: use_kernels = false takes the reference variants, entries override per mode */
    ct_kernel_table t;
    CHECK(ct_registry_resolve("cuda", &c.kernels, &t) == CT_OK);
    for (int i = 0; i < t.n_ops; i++) {
      if (!strcmp(t.op[i], "attention"))
        CHECK(!strcmp(t.variant[CT_KMODE_TRAIN][i], "eager") && !strcmp(t.variant[CT_KMODE_EVAL][i], "eager"));
      if (!strcmp(t.op[i], "xent"))
        CHECK(!strcmp(t.variant[CT_KMODE_TRAIN][i], "rowloop") && !strcmp(t.variant[CT_KMODE_EVAL][i], "rowloop"));
      if (!strcmp(t.op[i], "norm_bwd")) CHECK(!strcmp(t.variant[CT_KMODE_TRAIN][i], "twopass"));
    }
    ct_kernels_cfg on = {.use_kernels = true, .attention = "auto", .n = 1,
                         .entries = {{"cuda", "eval", "attention", "eager"}}};
    CHECK(ct_registry_resolve("cuda", &on, &t) == CT_OK);
    /* auto: the measured per-shape choice where cuDNN attention or flash3 is built, else flash */
    CHECK(!strcmp(t.op[0], "attention") &&
          !strcmp(t.variant[CT_KMODE_TRAIN][0], CT_HAVE_CUDNN || CT_HAVE_FLASH3 ? "auto" : "flash") &&
          !strcmp(t.variant[CT_KMODE_EVAL][0], "eager"));
    /* attention.deterministic: auto (possibly cuDNN's atomic backward) becomes flash, in both
     * modes; an explicit variant stays */
    on.deterministic = true;
    CHECK(ct_registry_resolve("cuda", &on, &t) == CT_OK);
    CHECK(!strcmp(t.variant[CT_KMODE_TRAIN][0], "flash") && !strcmp(t.variant[CT_KMODE_EVAL][0], "eager"));
#if CT_HAVE_CUDNN || CT_HAVE_FLASH3
    on.entries[0] = (ct_kernel_entry){"cuda", "eval", "attention", "auto"};
    CHECK(ct_registry_resolve("cuda", &on, &t) == CT_OK);
    CHECK(!strcmp(t.variant[CT_KMODE_EVAL][0], "flash"));
    on.entries[0] = (ct_kernel_entry){"cuda", "eval", "attention", "eager"};
#endif
    on.deterministic = false;
    snprintf(on.attention, sizeof on.attention, "cudnn");
#if CT_HAVE_CUDNN
    CHECK(ct_registry_resolve("cuda", &on, &t) == CT_OK);
    CHECK(!strcmp(t.variant[CT_KMODE_TRAIN][0], "cudnn"));
    CHECK(strstr(ct_registry_attention_available(), "cudnn") != NULL);
    CHECK(ct_registry_resolve("cpu", &on, &t) == CT_ERR_CONFIG); /* a CUDA kernel */
    CHECK(strstr(ct_last_error(), "on the CPU the available implementations are auto, sdpa and eager"));
#else
    CHECK(ct_registry_resolve("cuda", &on, &t) == CT_ERR_CONFIG);
    CHECK(strstr(ct_last_error(), "available: auto, sdpa, eager, flash") != NULL);
    CHECK(ct_registry_resolve("cpu", &on, &t) == CT_ERR_CONFIG);
    CHECK(strstr(ct_last_error(), "no cuDNN attention") != NULL);
#endif
    snprintf(on.attention, sizeof on.attention, "flash");
    CHECK(ct_registry_resolve("cpu", &on, &t) == CT_ERR_CONFIG);
    CHECK(strstr(ct_last_error(), "on the CPU the available implementations are auto, sdpa and eager"));
  }
  expect_error("", "kernels.cuda.train.attenton=flash", CT_ERR_CONFIG,
               "unknown op 'attenton' (ops with variants on cuda: attention, matmul, mlp");
  expect_error("", "kernels.cuda.train.attention=flash9", CT_ERR_CONFIG,
               CT_HAVE_CUDNN ? (CT_HAVE_FLASH3 ? "unknown variant 'flash9' (valid: auto, flash, cudnn, flash1, flash2b, flash3, eager)"
                                               : "unknown variant 'flash9' (valid: auto, flash, cudnn, flash1, flash2b, eager)")
                             : (CT_HAVE_FLASH3 ? "unknown variant 'flash9' (valid: auto, flash, flash1, flash2b, flash3, eager)"
                                               : "unknown variant 'flash9' (valid: flash, flash1, flash2b, eager)"));
  expect_error("", "kernels.tpu.train.attention=flash", CT_ERR_CONFIG, "unknown device 'tpu'");
  expect_error("", "kernels.cuda.infer.attention=flash", CT_ERR_CONFIG, "unknown mode 'infer'");
  expect_error("", "attention.implementation=xformers", CT_ERR_CONFIG,
               "\"xformers\" is not one of auto|sdpa|eager|flash|cudnn");

  /* round trip through the checkpoint's TOML text */
  p = write_cfg("rt.toml", "[model]\narch=\"llama\"\nn_layer=2\nqk_norm=true\n[train]\nlr=1.5e-3\n"
                "sample_prompt = \"a \\\"quoted\\\" \\\\ prompt\\n\"\n");
  CHECK(ct_config_load(p, 0, NULL, &c) == CT_OK);
  char *text = ct_config_to_toml(&c);
  ct_config back;
  CHECK(text && ct_config_from_toml_text(text, "rt", &back) == CT_OK);
  CHECK(!memcmp(&back.model, &c.model, sizeof c.model));
  CHECK(!memcmp(&back.data, &c.data, sizeof c.data));
  CHECK(back.train.lr == c.train.lr);
  CHECK(!strcmp(back.train.sample_prompt, "a \"quoted\" \\ prompt\n"));
  free(text);
  /* parallel.sparse_embedding_grad = false from a file survives the round trip */
  p = write_cfg("sp.toml", "[parallel]\nsparse_embedding_grad = false\n");
  CHECK(ct_config_load(p, 0, NULL, &c) == CT_OK && !c.parallel.sparse_embedding_grad);
  text = ct_config_to_toml(&c);
  CHECK(text && ct_config_from_toml_text(text, "sp", &back) == CT_OK && !back.parallel.sparse_embedding_grad);
  free(text);

  /* unknown keys: file location and suggestion */
  expect_error("[model]\nn_layers = 2\n", NULL, CT_ERR_CONFIG,
               "e.toml:2:1: model.n_layers: unknown key; did you mean model.n_layer?");
  expect_error("", "train.learning_rate=1", CT_ERR_CONFIG, "train.learning_rate: unknown key");
  expect_error("", "train.lrr=1", CT_ERR_CONFIG, "did you mean train.lr?");
  expect_error("[optim]\nlr = 1\n", NULL, CT_ERR_CONFIG, "[optim]: unknown section");
  expect_error("lr = 1\n", NULL, CT_ERR_CONFIG, "e.toml:1:1: lr: unknown key");
  /* wrong types */
  expect_error("[train]\nlr = \"fast\"\n", NULL, CT_ERR_CONFIG,
               "e.toml:2:6: train.lr: expected a number, got string");
  expect_error("[model]\nn_layer = 2.5\n", NULL, CT_ERR_CONFIG, "model.n_layer: expected an integer, got float");
  expect_error("[model]\nqk_norm = 1\n", NULL, CT_ERR_CONFIG, "model.qk_norm: expected true or false");
  expect_error("[train]\nseed = -1\n", NULL, CT_ERR_CONFIG, "train.seed: expected a non-negative integer");
  expect_error("", "model.n_layer=99999999999", CT_ERR_CONFIG, "out of range");
  expect_error("", "train.precision=fp8", CT_ERR_CONFIG, "\"fp8\" is not one of auto|fp32|bf16|fp16");
  /* malformed TOML keeps the parser's location */
  expect_error("[model]\nn_layer = = 2\n", NULL, CT_ERR_CONFIG, "e.toml:2:");
  /* value and relation checks */
  expect_error("", "model.n_layer=0", CT_ERR_CONFIG, "model.n_layer = 0: must be positive");
  expect_error("[model]\nd_model = 100\nn_head = 3\n", NULL, CT_ERR_CONFIG,
               "model.d_model = 100 is not divisible by model.n_head = 3");
  expect_error("[model]\narch = \"llama\"\nn_head = 4\nn_kv_head = 3\n", NULL, CT_ERR_CONFIG,
               "model.n_head = 4 is not divisible by model.n_kv_head = 3");
  expect_error("[model]\nn_kv_head = 2\n", NULL, CT_ERR_CONFIG, "gpt2 has no grouped-query attention");
  expect_error("[model]\nqk_norm = true\n", NULL, CT_ERR_CONFIG, "only arch = \"llama\" supports qk_norm");
  expect_error("[model]\narch = \"llama\"\nhead_dim = 7\n", NULL, CT_ERR_CONFIG, "even head dimension");
  expect_error("[train]\nseq_len = 4096\n", NULL, CT_ERR_CONFIG, "train.seq_len = 4096 exceeds model.max_seq_len");
  expect_error("", "train.beta2=1.0", CT_ERR_CONFIG, "train.beta2 = 1: must be in [0, 1)");
  expect_error("", "train.grad_accum=0", CT_ERR_CONFIG, "train.grad_accum = 0: must be positive");
  expect_error("", "parallel.overlap_ctas=-1", CT_ERR_CONFIG, "parallel.overlap_ctas = -1: must not be negative");
  expect_error("[parallel]\ndata = \"zero1\"\nce_allreduce = true\n", NULL, CT_ERR_CONFIG,
               "parallel.ce_allreduce = true works with parallel.data = \"ddp\"");
  expect_error("", "parallel.sparse_embedding_grad=no", CT_ERR_CONFIG,
               "parallel.sparse_embedding_grad: expected true or false");
  expect_error("", "data.train=", CT_ERR_CONFIG, "data.train: must name a token file");
  expect_error("", "model.vocab_size=1", CT_ERR_CONFIG, "model.vocab_size = 1: must be at least 2");
  /* a missing config file is an input error naming the path */
  ct_status st = ct_config_load("/nonexistent/x.toml", 0, NULL, &c);
  CHECK(st == CT_ERR_INPUT && strstr(ct_last_error(), "/nonexistent/x.toml"));
  CHECK(ct_status_exit_code(st) == 2);

  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return ct_test_finish();
}

/* tests/unit/test_golden.c — the model against PyTorch / Hugging Face Transformers.
 *
 * tools/make_golden.py wrote tests/fixtures/golden_{gpt2,llama}.h5 from GPT2LMHeadModel and a
 * Qwen3-style llama (GQA, q/k RMSNorm, untied head) in float32: the config as root attributes,
 * /inputs, /targets, the initial /params and their /grads (ctrain names and layout), /logits,
 * /loss, and five AdamW steps (/adamw_losses, /adamw_grad_norms). For each fixture this test
 *   - maps every fixture tensor to exactly one parameter-table entry and back,
 *   - compares logits (rtol 1e-4), the mean loss (relative 1e-5) and every gradient (rtol 1e-4,
 *     normalized by the tensor's max |ref|, no absolute slack),
 *   - runs the fixture's AdamW steps like trainer/train.c does and compares each step's loss
 *     (relative 1e-5) and pre-clip gradient norm (relative 1e-4),
 *   - saves a checkpoint with the AdamW state, reloads it into a second model and optimizer,
 *     checks bit-identical parameters, moments and logits, then continues training both for
 *     three steps and checks bit-identical losses (save -> load -> continue).
 * The embedding / head rows are padded (vocab_pad 96: 256 -> 288 rows) so the padded rows are
 * exercised: they must stay exactly zero in weights and gradients throughout.
 * CPU only. Fixtures are found through $CT_SOURCE_ROOT (meson sets it), else relative to the
 * current directory or to this source file. Checkpoints go to a fresh $TMPDIR directory that
 * is removed at the end. */
#define _GNU_SOURCE
#include <ftw.h>
#include <hdf5.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/status.h"
#include "common/util.h"
#include "kernels/ops.h"
#include "optim/optim.h"
#include "tests/unit/ct_test.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"
#include "trainer/model.h"
#include "ct_build_config.h"
#if CT_HAVE_CUDA
#include "kernels/cuda/ops_cuda.h"
#endif

/* CT_TEST_BACKEND=cuda runs the same comparisons on the fp32 CUDA table (the GPU suite's
 * whole-model check); the default is the CPU reference. */
static const ct_ops *test_ops;

#define VOCAB_PAD 96 /* 256 -> 288 rows: padding rows exist in both fixtures */

/* ---- fixture lookup ---- */

static bool locate_fixture(const char *name, char *out, size_t cap) {
  const char *root = getenv("CT_SOURCE_ROOT");
  if (root && *root) {
    snprintf(out, cap, "%s/tests/fixtures/%s", root, name);
    return ct_file_exists(out);
  }
  snprintf(out, cap, "tests/fixtures/%s", name);
  if (ct_file_exists(out)) return true;
  /* __FILE__ is the path the compiler was given, e.g. "../tests/unit/test_golden.c" */
  const char *self = __FILE__, *tail = strstr(self, "tests/unit/test_golden.c");
  if (tail) {
    snprintf(out, cap, "%.*stests/fixtures/%s", (int)(tail - self), self, name);
    if (ct_file_exists(out)) return true;
  }
  snprintf(out, cap, "tests/fixtures/%s", name);
  return false;
}

/* ---- HDF5 reading (the fixtures are small; everything is read whole) ---- */

static bool attr_exists(hid_t f, const char *name) { return H5Aexists(f, name) > 0; }

static bool attr_i64(hid_t f, const char *name, long long *out) {
  if (!attr_exists(f, name)) return false;
  hid_t a = H5Aopen(f, name, H5P_DEFAULT);
  herr_t rc = H5Aread(a, H5T_NATIVE_LLONG, out);
  H5Aclose(a);
  return rc >= 0;
}

static bool attr_f64(hid_t f, const char *name, double *out) {
  if (!attr_exists(f, name)) return false;
  hid_t a = H5Aopen(f, name, H5P_DEFAULT);
  herr_t rc = H5Aread(a, H5T_NATIVE_DOUBLE, out);
  H5Aclose(a);
  return rc >= 0;
}

/* Variable-length UTF-8 string attribute (h5py string_dtype) into out. */
static bool attr_str(hid_t f, const char *name, char *out, size_t cap) {
  out[0] = '\0';
  if (!attr_exists(f, name)) return false;
  hid_t a = H5Aopen(f, name, H5P_DEFAULT);
  hid_t ft = H5Aget_type(a);
  bool ok = false;
  if (H5Tis_variable_str(ft) > 0) {
    hid_t mt = H5Tcopy(H5T_C_S1);
    H5Tset_size(mt, H5T_VARIABLE);
    H5Tset_cset(mt, H5T_CSET_UTF8);
    char *s = NULL;
    if (H5Aread(a, mt, &s) >= 0 && s) {
      snprintf(out, cap, "%s", s);
      H5free_memory(s);
      ok = true;
    }
    H5Tclose(mt);
  }
  H5Tclose(ft);
  H5Aclose(a);
  return ok;
}

/* Reads a whole dataset as `mem` type; returns malloc'd data, fills ndim/dims (up to 3). */
static void *read_dataset(hid_t f, const char *path, hid_t mem, size_t elem, int *ndim,
                          hsize_t dims[3], size_t *n) {
  *n = 0;
  *ndim = 0;
  if (H5Lexists(f, path, H5P_DEFAULT) <= 0) return NULL;
  hid_t d = H5Dopen2(f, path, H5P_DEFAULT);
  if (d < 0) return NULL;
  hid_t s = H5Dget_space(d);
  int nd = H5Sget_simple_extent_ndims(s);
  void *buf = NULL;
  if (nd >= 0 && nd <= 3) {
    H5Sget_simple_extent_dims(s, dims, NULL);
    size_t cnt = 1;
    for (int i = 0; i < nd; i++) cnt *= (size_t)dims[i];
    buf = malloc(cnt * elem + 1);
    if (buf && H5Dread(d, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) { free(buf); buf = NULL; }
    if (buf) { *n = cnt; *ndim = nd; }
  }
  H5Sclose(s);
  H5Dclose(d);
  return buf;
}

static float *read_f32(hid_t f, const char *path, int *ndim, hsize_t dims[3], size_t *n) {
  return read_dataset(f, path, H5T_NATIVE_FLOAT, sizeof(float), ndim, dims, n);
}

/* Names of the links in a group (malloc'd array of malloc'd strings). */
static int list_group(hid_t f, const char *group, char ***names) {
  *names = NULL;
  if (H5Lexists(f, group, H5P_DEFAULT) <= 0) return -1;
  hid_t g = H5Gopen2(f, group, H5P_DEFAULT);
  if (g < 0) return -1;
  H5G_info_t info;
  H5Gget_info(g, &info);
  int n = (int)info.nlinks;
  *names = calloc((size_t)n + 1, sizeof **names);
  for (int i = 0; i < n; i++) {
    ssize_t len = H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, (hsize_t)i, NULL, 0,
                                     H5P_DEFAULT);
    (*names)[i] = calloc((size_t)len + 1, 1);
    H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, (hsize_t)i, (*names)[i],
                       (size_t)len + 1, H5P_DEFAULT);
  }
  H5Gclose(g);
  return n;
}

static void free_names(char **names, int n) {
  for (int i = 0; i < n; i++) free(names[i]);
  free(names);
}

/* ---- helpers ---- */

static bool is_vocab_tensor(const char *name) {
  return !strcmp(name, "wte") || !strcmp(name, "embed_tokens") || !strcmp(name, "lm_head");
}

/* "h.1.attn.c_attn.weight" / "layers.0.mlp.down_proj.weight" -> "attn.c_attn.weight" ... */
static const char *tensor_class(const char *name) {
  const char *p = name;
  if (!strncmp(p, "h.", 2)) p += 2;
  else if (!strncmp(p, "layers.", 7)) p += 7;
  else return name;
  while (*p >= '0' && *p <= '9') p++;
  return *p == '.' ? p + 1 : name;
}

typedef struct worst_table {
  char name[32][96];
  double err[32];
  int n;
} worst_table;

static void note_worst(worst_table *w, const char *cls, double err) {
  for (int i = 0; i < w->n; i++)
    if (!strcmp(w->name[i], cls)) { if (err > w->err[i]) w->err[i] = err; return; }
  if (w->n == 32) return;
  snprintf(w->name[w->n], sizeof w->name[0], "%s", cls);
  w->err[w->n++] = err;
}

static double rel_err(double got, double want) {
  return fabs(got - want) / fmax(fabs(want), 1e-30);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb; (void)flag; (void)ftw;
  return remove(path);
}

/* Copies the fixture tensors into a zeroed host image of the flat buffer. Every fixture
 * tensor must name exactly one table entry with its shape (vocab tensors: V of the Vp rows),
 * and every table entry must be covered. Returns false (after CHECK failures) otherwise. */
static bool load_tensors(hid_t f, const char *group, ct_model *m, int V, float *host,
                         const char *arch) {
  char **names;
  int n = list_group(f, group, &names);
  CHECK_MSG(n > 0, "%s: group %s missing or empty", arch, group);
  if (n <= 0) { free_names(names, 0); return false; }
  const int np = ct_model_n_params(m);
  int *hits = calloc((size_t)np, sizeof *hits);
  bool ok = true;
  for (int i = 0; i < n; i++) {
    const ct_param *p = ct_model_find_param(m, names[i]);
    CHECK_MSG(p != NULL, "%s: fixture tensor %s/%s has no parameter-table entry", arch, group,
              names[i]);
    if (!p) { ok = false; continue; }
    hits[p - ct_model_param(m, 0)]++;
    char path[256];
    snprintf(path, sizeof path, "%s/%s", group, names[i]);
    int nd;
    hsize_t dims[3];
    size_t cnt;
    float *t = read_f32(f, path, &nd, dims, &cnt);
    const int rows = is_vocab_tensor(p->name) ? V : p->shape[0];
    bool shape_ok = t && nd == p->ndim && (int)dims[0] == rows &&
                    (p->ndim == 1 || (int)dims[1] == p->shape[1]);
    CHECK_MSG(shape_ok, "%s: %s has shape (%d: %llu, %llu), table wants (%d: %d, %d)", arch, path,
              nd, (unsigned long long)dims[0], (unsigned long long)(nd > 1 ? dims[1] : 0),
              p->ndim, rows, p->ndim == 2 ? p->shape[1] : 0);
    if (shape_ok) memcpy(host + p->offset, t, cnt * sizeof(float));
    else ok = false;
    free(t);
  }
  for (int i = 0; i < np; i++) {
    CHECK_MSG(hits[i] == 1, "%s: table entry %s matched %d fixture tensors in %s (want 1)", arch,
              ct_model_param(m, i)->name, hits[i], group);
    if (hits[i] != 1) ok = false;
  }
  free(hits);
  free_names(names, n);
  return ok;
}

/* Checks that rows V..Vp-1 of every vocab tensor are exactly zero in a host image. */
static bool padding_zero(ct_model *m, const float *host, int V) {
  for (int i = 0; i < ct_model_n_params(m); i++) {
    const ct_param *p = ct_model_param(m, i);
    if (!is_vocab_tensor(p->name)) continue;
    for (size_t j = (size_t)V * p->shape[1]; j < p->numel; j++)
      if (host[p->offset + j] != 0.0f) return false;
  }
  return true;
}

/* ---- one fixture ---- */

static void run_fixture(const char *fname, const char *tmpdir) {
  double t0 = ct_now();
  char path[4096];
  if (!locate_fixture(fname, path, sizeof path)) {
    CHECK_MSG(0, "golden fixture %s not found (looked for %s; set CT_SOURCE_ROOT to the source"
              " tree or regenerate with tools/make_golden.py)", fname, path);
    return;
  }
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  CHECK_MSG(f >= 0, "%s: not a readable HDF5 file", path);
  if (f < 0) return;

  /* config from the root attributes; derived values the way ct_config_validate fills them */
  ct_config cfg;
  ct_config_defaults(&cfg);
  ct_model_cfg *mc = &cfg.model;
  ct_train_cfg *tc = &cfg.train;
  char arch[sizeof mc->arch], torch_v[64], tf_v[64];
  long long n_layer, n_head, n_kv, d_model, head_dim, d_ff, vocab, max_seq, qk_norm, tie, bias;
  long long B, T, steps;
  double rope_theta, norm_eps;
  bool attrs_ok = attr_str(f, "arch", arch, sizeof arch) && attr_i64(f, "n_layer", &n_layer) &&
                  attr_i64(f, "n_head", &n_head) && attr_i64(f, "n_kv_head", &n_kv) &&
                  attr_i64(f, "d_model", &d_model) && attr_i64(f, "head_dim", &head_dim) &&
                  attr_i64(f, "d_ff", &d_ff) && attr_i64(f, "vocab_size", &vocab) &&
                  attr_i64(f, "max_seq_len", &max_seq) && attr_f64(f, "rope_theta", &rope_theta) &&
                  attr_f64(f, "norm_eps", &norm_eps) && attr_i64(f, "qk_norm", &qk_norm) &&
                  attr_i64(f, "tie_embeddings", &tie) && attr_i64(f, "attn_bias", &bias) &&
                  attr_i64(f, "B", &B) && attr_i64(f, "T", &T) &&
                  attr_i64(f, "adamw_steps", &steps) && attr_f64(f, "lr", &tc->lr) &&
                  attr_f64(f, "beta1", &tc->beta1) && attr_f64(f, "beta2", &tc->beta2) &&
                  attr_f64(f, "eps", &tc->eps) && attr_f64(f, "weight_decay", &tc->weight_decay) &&
                  attr_f64(f, "grad_clip", &tc->grad_clip);
  CHECK_MSG(attrs_ok, "%s: a root attribute is missing or has the wrong type", path);
  if (!attrs_ok) { H5Fclose(f); return; }
  attr_str(f, "torch_version", torch_v, sizeof torch_v);
  attr_str(f, "transformers_version", tf_v, sizeof tf_v);
  snprintf(mc->arch, sizeof mc->arch, "%s", arch);
  mc->n_layer = (int)n_layer;
  mc->n_head = (int)n_head;
  mc->n_kv_head = (int)n_kv;
  mc->d_model = (int)d_model;
  mc->head_dim = (int)head_dim;
  mc->d_ff = (int)d_ff;
  mc->vocab_size = (int)vocab;
  mc->vocab_pad = VOCAB_PAD;
  mc->max_seq_len = (int)max_seq;
  mc->rope_theta = rope_theta;
  mc->norm_eps = norm_eps;
  mc->qk_norm = qk_norm != 0;
  mc->tie_embeddings = tie != 0;
  mc->attn_bias = bias != 0;
  tc->seq_len = (int)T;
  tc->micro_batch = (int)B;
  tc->grad_accum = 1;
  tc->max_steps = (int)steps;
  snprintf(tc->schedule, sizeof tc->schedule, "constant"); /* torch ran a constant lr */
  tc->warmup_steps = 0;
  snprintf(cfg.name, sizeof cfg.name, "golden_%s", arch);
  snprintf(tc->out_dir, sizeof tc->out_dir, "%s/%s", tmpdir, arch);
  ct_status st = ct_config_validate(&cfg);
  CHECK_MSG(st == CT_OK, "%s: config does not validate: %s", path, ct_last_error());
  if (st != CT_OK) { H5Fclose(f); return; }
  const int V = mc->vocab_size, Vp = ct_model_padded_vocab(mc), N = (int)(B * T);
  printf("%s: %s, torch %s, transformers %s; L=%d C=%d H=%d KV=%d hd=%d F=%d V=%d (padded %d)"
         " T=%lld B=%lld%s%s\n", arch, path, torch_v, tf_v, mc->n_layer, mc->d_model, mc->n_head,
         mc->n_kv_head, mc->head_dim, mc->d_ff, V, Vp, T, B, mc->qk_norm ? " qk_norm" : "",
         mc->tie_embeddings ? " tied" : " untied");

  /* reference tensors */
  int nd;
  hsize_t dims[3];
  size_t cnt;
  int32_t *inputs = read_dataset(f, "inputs", H5T_NATIVE_INT32, 4, &nd, dims, &cnt);
  CHECK_MSG(inputs && cnt == (size_t)N, "%s: /inputs missing or not (B,T)", path);
  int32_t *targets = read_dataset(f, "targets", H5T_NATIVE_INT32, 4, &nd, dims, &cnt);
  CHECK_MSG(targets && cnt == (size_t)N, "%s: /targets missing or not (B,T)", path);
  float *ref_logits = read_f32(f, "logits", &nd, dims, &cnt);
  CHECK_MSG(ref_logits && cnt == (size_t)N * V, "%s: /logits missing or not (B,T,V)", path);
  size_t n_loss, n_al, n_an;
  float *ref_loss = read_f32(f, "loss", &nd, dims, &n_loss);
  float *ref_al = read_f32(f, "adamw_losses", &nd, dims, &n_al);
  float *ref_an = read_f32(f, "adamw_grad_norms", &nd, dims, &n_an);
  CHECK_MSG(ref_loss && n_loss == 1, "%s: /loss missing", path);
  CHECK_MSG(ref_al && ref_an && n_al == (size_t)steps && n_an == (size_t)steps,
            "%s: /adamw_losses or /adamw_grad_norms missing or not (adamw_steps)", path);
  if (!inputs || !targets || !ref_logits || !ref_loss || !ref_al || !ref_an ||
      cnt != (size_t)N * V || n_al != (size_t)steps || n_an != (size_t)steps)
    goto close_file;

  /* model and parameters */
  const ct_ops *ops = test_ops;
  ct_model *m = NULL, *m2 = NULL;
  st = ct_model_create(mc, ops, (int)B, (int)T, &m);
  CHECK_MSG(st == CT_OK, "%s: ct_model_create: %s", arch, ct_last_error());
  if (st != CT_OK) goto close_file;
  const size_t numel = ct_model_numel(m);
  float *w0 = calloc(numel, sizeof(float)), *wref_grad = calloc(numel, sizeof(float));
  float *host = calloc(numel, sizeof(float));
  float *buf = malloc((size_t)N * Vp * sizeof(float));
  bool params_ok = load_tensors(f, "params", m, V, w0, arch);
  bool grads_ok = load_tensors(f, "grads", m, V, wref_grad, arch);
  if (!params_ok || !grads_ok) goto free_model;
  ops->to_device(ct_model_params(m), w0, numel * sizeof(float));

  /* logits: a forward without targets (with targets xent overwrites them in place) */
  worst_table worst = {.n = 0};
  st = ct_model_forward(m, inputs, NULL, (int)B, (int)T, 0.0f, NULL);
  CHECK_MSG(st == CT_OK, "%s: forward: %s", arch, ct_last_error());
  ops->to_host(buf, ct_model_logits(m), (size_t)N * Vp * sizeof(float));
  for (int n = 0; n < N; n++) memmove(buf + (size_t)n * V, buf + (size_t)n * Vp, V * sizeof(float));
  char what[160];
  snprintf(what, sizeof what, "%s logits", arch);
  double e_logits = ct_check_close(what, buf, ref_logits, (size_t)N * V, 1e-4, 0.0);

  /* loss and gradients of the mean loss */
  const float gscale = 1.0f / (float)(B * T);
  float loss = 0;
  ct_model_zero_grad(m);
  st = ct_model_forward(m, inputs, targets, (int)B, (int)T, gscale, &loss);
  CHECK_MSG(st == CT_OK, "%s: forward with targets: %s", arch, ct_last_error());
  double e_loss = rel_err(loss, ref_loss[0]);
  CHECK_MSG(e_loss <= 1e-5, "%s: loss %.9g vs torch %.9g (relative %.2e > 1e-5)", arch, loss,
            ref_loss[0], e_loss);
  st = ct_model_backward(m);
  CHECK_MSG(st == CT_OK, "%s: backward: %s", arch, ct_last_error());
  ops->to_host(host, ct_model_grads(m), numel * sizeof(float));
  double e_grad_all = 0;
  for (int i = 0; i < ct_model_n_params(m); i++) {
    const ct_param *p = ct_model_param(m, i);
    size_t n = is_vocab_tensor(p->name) ? (size_t)V * p->shape[1] : p->numel;
    snprintf(what, sizeof what, "%s grad %s", arch, p->name);
    double e = ct_check_close(what, host + p->offset, wref_grad + p->offset, n, 1e-4, 0.0);
    note_worst(&worst, tensor_class(p->name), e);
    if (e > e_grad_all) e_grad_all = e;
  }
  CHECK_MSG(padding_zero(m, host, V), "%s: padded vocab rows have a nonzero gradient", arch);

  /* AdamW from the same initial weights, step by step as trainer/train.c runs it */
  ops->to_device(ct_model_params(m), w0, numel * sizeof(float));
  ct_adamw opt = {0};
  st = ct_adamw_create(&opt, m, tc);
  CHECK_MSG(st == CT_OK, "%s: ct_adamw_create: %s", arch, ct_last_error());
  if (st != CT_OK) goto free_model;
  double e_al = 0, e_an = 0;
  float last_loss = 0;
  for (int s = 0; s < (int)steps; s++) {
    float l = 0;
    ct_model_zero_grad(m);
    st = ct_model_forward(m, inputs, targets, (int)B, (int)T, gscale, &l);
    if (st == CT_OK) st = ct_model_backward(m);
    CHECK_MSG(st == CT_OK, "%s: AdamW step %d: %s", arch, s + 1, ct_last_error());
    double norm = ct_grad_norm(m);
    ct_adamw_step(&opt, m, tc->lr, ct_clip_scale(norm, tc->grad_clip));
    double el = rel_err(l, ref_al[s]), en = rel_err(norm, ref_an[s]);
    CHECK_MSG(el <= 1e-5, "%s: AdamW step %d loss %.9g vs torch %.9g (relative %.2e > 1e-5)", arch,
              s + 1, l, ref_al[s], el);
    CHECK_MSG(en <= 1e-4, "%s: AdamW step %d grad norm %.9g vs torch %.9g (relative %.2e > 1e-4)",
              arch, s + 1, norm, ref_an[s], en);
    e_al = fmax(e_al, el);
    e_an = fmax(e_an, en);
    last_loss = l;
  }
  /* the fixture's steps must actually train (else the comparison proves little) */
  CHECK_MSG(last_loss < ref_al[0], "%s: loss did not decrease over %lld AdamW steps", arch, steps);
  ops->to_host(host, ct_model_params(m), numel * sizeof(float));
  CHECK_MSG(padding_zero(m, host, V), "%s: padded vocab rows changed under AdamW", arch);

  /* save -> load -> continue: a checkpoint with its AdamW state, reloaded into a second model
   * and optimizer, must reproduce the parameters, moments and logits bit for bit, and both
   * must then train on to the same losses bit for bit */
  char saved[4096], model_file[4096];
  ct_train_state ts = {.step = (int)steps, .world_size = 1, .rank = 0, .loss_scale = 1.0,
                       .opt = &opt};
  ct_adamw opt2 = {0};
  st = ct_checkpoint_save(tc->out_dir, (int)steps, &cfg, m, &ts, 1, saved, sizeof saved);
  CHECK_MSG(st == CT_OK, "%s: ct_checkpoint_save: %s", arch, ct_last_error());
  ct_config cfg2;
  if (st == CT_OK) {
    st = ct_checkpoint_read_config(saved, &cfg2, model_file, sizeof model_file);
    CHECK_MSG(st == CT_OK, "%s: ct_checkpoint_read_config: %s", arch, ct_last_error());
  }
  if (st == CT_OK) {
    const ct_model_cfg *a = mc, *b = &cfg2.model;
    CHECK_MSG(!strcmp(a->arch, b->arch) && a->n_layer == b->n_layer && a->n_head == b->n_head &&
              a->n_kv_head == b->n_kv_head && a->d_model == b->d_model &&
              a->head_dim == b->head_dim && a->d_ff == b->d_ff && a->vocab_size == b->vocab_size &&
              a->vocab_pad == b->vocab_pad && a->max_seq_len == b->max_seq_len &&
              a->rope_theta == b->rope_theta && a->norm_eps == b->norm_eps &&
              a->qk_norm == b->qk_norm && a->tie_embeddings == b->tie_embeddings &&
              a->attn_bias == b->attn_bias && a->init_std == b->init_std,
              "%s: model config read back from the checkpoint differs", arch);
    CHECK_MSG(cfg2.train.lr == tc->lr && cfg2.train.beta1 == tc->beta1 &&
              cfg2.train.beta2 == tc->beta2 && cfg2.train.eps == tc->eps &&
              cfg2.train.weight_decay == tc->weight_decay && cfg2.train.grad_clip == tc->grad_clip,
              "%s: AdamW settings read back from the checkpoint differ", arch);
    st = ct_model_create(&cfg2.model, ops, (int)B, (int)T, &m2);
    CHECK_MSG(st == CT_OK, "%s: ct_model_create (reload): %s", arch, ct_last_error());
  }
  if (st == CT_OK) {
    st = ct_checkpoint_load_params(model_file, m2);
    CHECK_MSG(st == CT_OK, "%s: ct_checkpoint_load_params: %s", arch, ct_last_error());
  }
  ct_train_state ts2 = {0};
  if (st == CT_OK) {
    st = ct_adamw_create(&opt2, m2, &cfg2.train);
    if (st == CT_OK) {
      ts2.opt = &opt2;
      st = ct_checkpoint_load_state(model_file, m2, &ts2);
    }
    CHECK_MSG(st == CT_OK, "%s: ct_checkpoint_load_state: %s", arch, ct_last_error());
  }
  if (st == CT_OK) {
    CHECK(ct_model_n_params(m2) == ct_model_n_params(m) && ct_model_numel(m2) == numel);
    CHECK_MSG(ts2.step == (int)steps && opt2.step == opt.step && ts2.world_size == 1 &&
              ts2.loss_scale == 1.0, "%s: training state read back: step %d, adam step %d (want"
              " %lld, %d)", arch, ts2.step, opt2.step, steps, opt.step);
    float *host2 = calloc(numel, sizeof(float)), *mom = calloc(numel, sizeof(float));
    float *mom2 = calloc(numel, sizeof(float));
    ops->to_host(host2, ct_model_params(m2), numel * sizeof(float));
    int differ = 0, mdiffer = 0;
    for (int k = 0; k < 2; k++) {
      ops->to_host(mom, k ? opt.v : opt.m, numel * sizeof(float));
      ops->to_host(mom2, k ? opt2.v : opt2.m, numel * sizeof(float));
      for (int i = 0; i < ct_model_n_params(m); i++) {
        const ct_param *p = ct_model_param(m, i);
        if (!k && memcmp(host + p->offset, host2 + p->offset, p->numel * sizeof(float))) differ++;
        if (memcmp(mom + p->offset, mom2 + p->offset, p->numel * sizeof(float))) mdiffer++;
      }
    }
    CHECK_MSG(differ == 0, "%s: %d tensors differ after save -> load", arch, differ);
    CHECK_MSG(mdiffer == 0, "%s: %d AdamW moment tensors differ after save -> load", arch, mdiffer);
    float *buf2 = malloc((size_t)N * Vp * sizeof(float));
    ct_model_forward(m, inputs, NULL, (int)B, (int)T, 0.0f, NULL);
    ct_model_forward(m2, inputs, NULL, (int)B, (int)T, 0.0f, NULL);
    ops->to_host(buf, ct_model_logits(m), (size_t)N * Vp * sizeof(float));
    ops->to_host(buf2, ct_model_logits(m2), (size_t)N * Vp * sizeof(float));
    CHECK_MSG(!memcmp(buf, buf2, (size_t)N * Vp * sizeof(float)),
              "%s: logits differ after save -> load", arch);
    /* continue: CONTINUE_STEPS more AdamW steps on each; the first loss is the loss at the
     * saved weights, the later ones depend on the restored moments and step count */
    enum { CONTINUE_STEPS = 3 };
    int same = 0;
    float la[CONTINUE_STEPS], lb[CONTINUE_STEPS];
    for (int s = 0; s < CONTINUE_STEPS; s++) {
      ct_model *mm[2] = {m, m2};
      ct_adamw *oo[2] = {&opt, &opt2};
      float *out[2] = {&la[s], &lb[s]};
      for (int k = 0; k < 2; k++) {
        ct_model_zero_grad(mm[k]);
        ct_status s1 = ct_model_forward(mm[k], inputs, targets, (int)B, (int)T, gscale, out[k]);
        if (s1 == CT_OK) s1 = ct_model_backward(mm[k]);
        CHECK_MSG(s1 == CT_OK, "%s: continued step %d: %s", arch, s + 1, ct_last_error());
        double norm = ct_grad_norm(mm[k]);
        ct_adamw_step(oo[k], mm[k], tc->lr, ct_clip_scale(norm, tc->grad_clip));
      }
      same += !memcmp(&la[s], &lb[s], sizeof(float));
    }
    CHECK_MSG(same == CONTINUE_STEPS, "%s: save -> load -> continue: %d of %d losses bit-identical"
              " (original %.9g %.9g %.9g, reloaded %.9g %.9g %.9g)", arch, same, CONTINUE_STEPS,
              la[0], la[1], la[2], lb[0], lb[1], lb[2]);
    CHECK_MSG(la[0] < last_loss && la[CONTINUE_STEPS - 1] < la[0],
              "%s: training did not continue downhill (%.9g after step %lld, then %.9g ... %.9g)",
              arch, last_loss, steps, la[0], la[CONTINUE_STEPS - 1]);
    printf("  save -> load -> continue (%s, with AdamW state): %d more steps, losses %.7f %.7f"
           " %.7f, %s\n", saved, CONTINUE_STEPS, la[0], la[1], la[2],
           same == CONTINUE_STEPS ? "bit-identical after reload" : "DIFFERENT after reload");
    free(buf2);
    free(host2);
    free(mom);
    free(mom2);
  }
  ct_adamw_destroy(&opt, ops);
  ct_adamw_destroy(&opt2, ops);

  printf("  worst normalized errors (max|diff| / max|ref|): logits %.2e, loss %.2e (relative),"
         " gradients %.2e\n", e_logits, e_loss, e_grad_all);
  for (int i = 0; i < worst.n; i++) printf("    grad %-32s %.2e\n", worst.name[i], worst.err[i]);
  printf("  AdamW %lld steps: loss relative %.2e (limit 1e-5), pre-clip grad norm relative %.2e"
         " (limit 1e-4); loss %.6f -> %.6f\n", steps, e_al, e_an, ref_al[0], last_loss);
  printf("  %s: %.2f s\n", arch, ct_now() - t0);

free_model:
  ct_model_destroy(m2);
  ct_model_destroy(m);
  free(w0);
  free(wref_grad);
  free(host);
  free(buf);
close_file:
  free(inputs);
  free(targets);
  free(ref_logits);
  free(ref_loss);
  free(ref_al);
  free(ref_an);
  H5Fclose(f);
}

int main(void) {
  double t0 = ct_now();
  test_ops = ct_ops_cpu();
  const char *backend = getenv("CT_TEST_BACKEND");
  if (backend && !strcmp(backend, "cuda")) {
#if CT_HAVE_CUDA
    char err[512];
    if (ct_cuda_init(0, err, sizeof err) != 0) {
      printf("no usable CUDA device (%s): skipped\n", err);
      return 77;
    }
    test_ops = ct_ops_cuda();
#else
    printf("CPU-only build: skipped\n");
    return 77;
#endif
  }
  printf("backend: %s\n", test_ops->name);
  const char *tmp = getenv("TMPDIR");
  char tmpdir[1024];
  snprintf(tmpdir, sizeof tmpdir, "%s/ct_golden_XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(tmpdir)) {
    fprintf(stderr, "cannot create a temporary directory %s\n", tmpdir);
    return 1;
  }
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* missing links/attributes are reported by the checks */
  run_fixture("golden_gpt2.h5", tmpdir);
  run_fixture("golden_llama.h5", tmpdir);
  nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  printf("total %.2f s\n", ct_now() - t0);
  return ct_test_finish();
}

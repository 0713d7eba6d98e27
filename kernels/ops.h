/* kernels/ops.h — the operation table. Model code calls every op through a ct_ops table and
 * never a backend directly; kernels/cpu/ holds the plain C11 (+OpenMP, OpenBLAS) reference,
 * kernels/cuda/ the fast versions behind the same signatures.
 *
 * Conventions (all ops):
 *   - N = B*T rows (tokens); C = model width; row-major, last index fastest.
 *   - Activation and working-weight pointers are `void *` in the backend's working dtype
 *     (fp32 on the CPU; bf16/fp16 on CUDA). Parameter gradients, norm statistics, losses and
 *     optimizer state are always fp32 (`float *`).
 *   - Linear weights use the PyTorch nn.Linear layout: W is (OC, IC), y = x W^T + b.
 *   - Backward ACCUMULATES (+=) into every gradient it writes, both parameter gradients and
 *     input gradients. The caller zeroes gradient buffers before a backward pass (and does not
 *     between micro-batches of gradient accumulation). A gradient pointer may be NULL when
 *     that gradient is not wanted (e.g. bias absent, dinp of the first layer's embedding).
 *   - qkv rows hold [q heads | k heads | v heads]: H*hd query values, then KV*hd keys, then
 *     KV*hd values, so a row is (H + 2*KV)*hd wide. Query head h uses kv head h / (H/KV).
 */
#ifndef CT_OPS_H
#define CT_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A slice of the flat parameter buffer for adamw_multi. */
typedef struct ct_adamw_seg {
  size_t off;  /* first float of the slice in param / grad */
  uint32_t n;  /* floats */
  float wd;    /* decoupled weight decay of the slice (0: none) */
} ct_adamw_seg;

/* One layer's device pointers for decode_layers (biases, q_norm and k_norm may be NULL). */
typedef struct ct_decode_layer {
  const void *ln1_w, *qkv_w, *qkv_b, *q_norm, *k_norm, *o_w, *o_b, *ln2_w, *fc_w, *proj_w,
      *proj_b;
  void *kc, *vc; /* the layer's KV cache */
} ct_decode_layer;

typedef struct ct_ops {
  const char *name;  /* "cpu", "cuda", "cuda-bf16" */
  const char *dtype; /* working dtype of activations and working weights: "fp32", "bf16", "fp16" */
  int act_bytes;     /* bytes per working-dtype element: 4 or 2 */

  /* ---- memory (device memory for CUDA, malloc for CPU) ---- */
  void *(*alloc)(size_t bytes);                 /* zero-filled; NULL on failure */
  void (*free)(void *p);
  void (*zero)(void *p, size_t bytes);
  void (*to_device)(void *dst, const void *src_host, size_t bytes);
  void (*to_host)(void *dst_host, const void *src, size_t bytes);
  /* Working copy of the fp32 master parameters: dst (n, working dtype) = src (n, fp32),
   * round to nearest even. (fp32 tables: a copy; the model then uses the master directly.) */
  void (*cast_params)(void *dst, const float *src, size_t n);
  /* Gradients on the wire (parallel.reduce_dtype = "bf16"), in every table whatever its dtype:
   * dst (n, bf16 bits) = src (n, fp32) rounded to nearest even (a NaN becomes 0x7fff), and back (exact). */
  void (*f32_to_bf16)(void *dst, const float *src, size_t n);
  void (*bf16_to_f32)(float *dst, const void *src, size_t n);
  /* dst_host (n, fp32) = src (n, working dtype, backend memory): logits to the host. */
  void (*to_host_f32)(float *dst_host, const void *src, size_t n);
  /* 2-D copy within device memory: `rows` rows of `row_bytes`, strides in bytes
   * (cudaMemcpy2D-style); used to move the v section of qkv rows around qk_norm. */
  void (*copy2d)(void *dst, size_t dst_stride, const void *src, size_t src_stride,
                 size_t row_bytes, size_t rows);

  /* ---- embedding ----
   * out(N,C) = wte[tok[n]] + (wpe ? wpe[n % T] : 0)                 wte (Vp,C), wpe (maxT,C) */
  void (*embed_fwd)(void *out, const int32_t *tok, const void *wte, const void *wpe,
                    int B, int T, int C);
  /* dwte[tok[n]] += dout[n]; dwpe[n % T] += dout[n] (if dwpe) */
  void (*embed_bwd)(float *dwte, float *dwpe, const void *dout, const int32_t *tok,
                    int B, int T, int C);

  /* ---- rows of an fp32 table (DDP's sparse embedding gradient, parallel/ddp.c) ----
   * rows and flags are int32 in backend memory; the rows given to take_rows and
   * scatter_add_rows are distinct.
   * flagged_rows: rows[0 .. k) = the indices i < n with flags[i] != 0, ascending (k, their count,
   * is the caller's to know); rows[k ..] is not written. */
  void (*flagged_rows)(int32_t *rows, const int32_t *flags, int n);
  /* dst (n, C) row i = src row rows[i], then that row of src is set to zero: the rows move out,
   * so a table that was zero elsewhere is all zero again for its next use. */
  void (*take_rows)(float *dst, float *src, const int32_t *rows, int n, int C);
  /* dst row rows[i] += src (n, C) row i */
  void (*scatter_add_rows)(float *dst, const float *src, const int32_t *rows, int n, int C);

  /* ---- normalization (statistics in fp32) ----
   * layernorm: out = (x - mean) * rstd * w + b, rstd = 1/sqrt(var + eps) (biased variance).
   * mean, rstd (N) are saved for backward. */
  void (*layernorm_fwd)(void *out, float *mean, float *rstd, const void *inp, const void *w,
                        const void *b, int N, int C, float eps);
  void (*layernorm_bwd)(void *dinp, float *dw, float *db, const void *dout, const void *inp,
                        const void *w, const float *mean, const float *rstd, int N, int C);
  /* rmsnorm: out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps); rows may be strided:
   * row r starts at inp + (r / rows_per_group) * group_stride + (r % rows_per_group) * C.
   * Plain use: rows_per_group = N, group_stride = 0 (rows contiguous). The strided form
   * normalizes the q or k heads inside qkv rows (Qwen3 qk_norm): C = hd, rows_per_group = H,
   * group_stride = qkv row width. out uses the same layout as inp. rstd (N) saved. */
  void (*rmsnorm_fwd)(void *out, float *rstd, const void *inp, const void *w, int N, int C,
                      int rows_per_group, long group_stride, float eps);
  void (*rmsnorm_bwd)(void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                      const float *rstd, int N, int C, int rows_per_group, long group_stride);

  /* Residual add fused with the next norm: res = a + b (res may alias a or b), then
   * out = norm(res) as layernorm_fwd (rms = 0; bias may be NULL) or rmsnorm_fwd (rms = 1, plain
   * rows; bias and mean ignored). mean (layernorm) and rstd (N) saved for backward. */
  void (*add_norm_fwd)(void *res, void *out, float *mean, float *rstd, const void *a,
                       const void *b, const void *w, const void *bias, int N, int C, float eps,
                       int rms);

  /* ---- matmul (fp32 accumulate) ----
   * out(N,OC) = inp(N,IC) @ w(OC,IC)^T + bias(OC)   (bias may be NULL; out overwritten) */
  void (*matmul_fwd)(void *out, const void *inp, const void *w, const void *bias,
                     int N, int IC, int OC);
  /* dinp(N,IC) += dout @ w;  dw(OC,IC) += dout^T @ inp;  dbias(OC) += sum_n dout */
  void (*matmul_bwd)(void *dinp, float *dw, float *dbias, const void *dout, const void *inp,
                     const void *w, int N, int IC, int OC);

  /* ---- rotary position embedding, HF "rotate_half" convention, in place ----
   * On the q and k heads of qkv (N rows of (H+2KV)*hd): for each head and i < hd/2,
   *   x1 = x[i], x2 = x[i + hd/2]; x[i] = x1*cos - x2*sin; x[i+hd/2] = x2*cos + x1*sin
   * with angle (pos0 + t) * theta^(-2i/hd), t = n % T. v is untouched.
   * rope_bwd applies the inverse rotation to dqkv in place (rope is linear). */
  void (*rope_fwd)(void *qkv, int B, int T, int H, int KV, int hd, int pos0, float theta);
  void (*rope_bwd)(void *dqkv, int B, int T, int H, int KV, int hd, int pos0, float theta);

  /* ---- causal self-attention with grouped-query heads ----
   * out(N, H*hd) = softmax(q k^T / sqrt(hd) + causal mask) v, per batch and head.
   * `state` is backend-defined saved state for backward, attention_state_floats() floats
   * (CPU: the probabilities (B,H,T,T)). */
  size_t (*attention_state_floats)(int B, int T, int H, int KV, int hd);
  void (*attention_fwd)(void *out, float *state, const void *qkv, int B, int T, int H, int KV,
                        int hd);
  /* dqkv += gradient w.r.t. qkv (q, k and v sections). */
  void (*attention_bwd)(void *dqkv, const void *dout, const void *qkv, const float *state,
                        int B, int T, int H, int KV, int hd);
  /* dqkv = gradient w.r.t. qkv: what attention_bwd adds into a zeroed dqkv, without reading
   * dqkv first (cuDNN then writes its gradients in place, with no scratch buffer and no add
   * pass). NULL in tables without it: callers zero dqkv and call attention_bwd. */
  void (*attention_bwd_set)(void *dqkv, const void *dout, const void *qkv, const float *state,
                            int B, int T, int H, int KV, int hd);

  /* Inference with a KV cache: n new query rows at positions pos0 .. pos0+n-1 attend over the
   * cache, which already holds keys/values for positions 0 .. pos0+n-1 (the new ones included).
   * qkv: n rows in the qkv layout (only the q section is read); kc, vc: (KV, max_T, hd);
   * out (n, H*hd). Query i sees keys 0 .. pos0+i. Keeps nothing for backward. */
  void (*attention_cached)(void *out, const void *qkv, const void *kc, const void *vc, int n,
                           int pos0, int H, int KV, int hd, int max_T);

  /* ---- activations ----
   * gelu: tanh approximation (GPT-2 "gelu_new"), n elements. */
  void (*gelu_fwd)(void *out, const void *inp, size_t n);
  void (*gelu_bwd)(void *dinp, const void *dout, const void *inp, size_t n);
  /* swiglu: inp (N, 2F) rows [gate | up]; out (N, F) = silu(gate) * up. */
  void (*swiglu_fwd)(void *out, const void *inp, int N, int F);
  void (*swiglu_bwd)(void *dinp, const void *dout, const void *inp, int N, int F);

  /* ---- fused linear + GELU (GPT-2's MLP up projection) ----
   * pre(N,OC) = inp @ w^T + bias (bias may be NULL); act = gelu(pre). Both written (=). */
  void (*matmul_gelu_fwd)(void *act, void *pre, const void *inp, const void *w, const void *bias,
                          int N, int IC, int OC);
  /* dpre(N,IC) = (dout(N,OC) @ w(OC,IC)) * gelu'(pre), OVERWRITTEN (not accumulated): the input
   * gradient of matmul(gelu(pre)) through both, without materializing d(gelu output). */
  void (*matmul_dgelu_bwd)(void *dpre, const void *dout, const void *w, const void *pre, int N,
                           int IC, int OC);

  /* out = a + b, n elements (out may alias a or b). */
  void (*add_fwd)(void *out, const void *a, const void *b, size_t n);

  /* ---- fused softmax + cross-entropy ----
   * logits (N, Vp), only the first V columns are real (padding columns get zero gradient).
   * losses[n] = -log softmax(logits[n])[targets[n]]; targets[n] < 0 means "ignore" (loss 0).
   * If `grad_scale` != 0, logits is overwritten IN PLACE by the gradient of
   * grad_scale * sum_n losses[n] w.r.t. logits (padding columns set to 0; ignored rows 0).
   * Nothing else is stored, so (N, V) probabilities are never materialized separately. */
  void (*xent_fwd_bwd)(float *losses, void *logits, const int32_t *targets, int N, int V,
                       int Vp, float grad_scale);

  /* ---- optimizer & reductions (fp32 master state) ----
   * AdamW, PyTorch semantics, `step` 1-based:
   *   m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr * wd * p (decoupled);
   *   p -= lr * (m / (1-b1^step)) / (sqrt(v / (1-b2^step)) + eps)
   * g is read as grad * grad_scale (for clipping and loss-scale unscaling). */
  void (*adamw)(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                float b1, float b2, float eps, float wd, float grad_scale, int step);
  /* Multi-tensor AdamW: one launch for many slices. Segment s updates floats
   * [off, off + n) of param/grad and [off - mv_base, ...) of m/v with weight decay wd, with the
   * arithmetic of adamw. segs (nseg entries) lives in backend memory; the optimizer builds it
   * once. */
  void (*adamw_multi)(float *param, const float *grad, float *m, float *v, size_t mv_base,
                      const struct ct_adamw_seg *segs, int nseg, float lr, float b1, float b2,
                      float eps, float grad_scale, int step);
  /* sum of squares in double precision */
  double (*sumsq)(const float *x, size_t n);
  /* x *= s */
  void (*scale)(float *x, float s, size_t n);

  /* ---- batched inference (trainer/model.c's ct_infer; CPU references in kernels/cpu/decode.c)
   * A KV cache layer is (S, KV, max_T, hd) for S sequence slots. Row n of a batch belongs to
   * slot slot[n] and holds the token at position pos[n]; slot and pos (N) are int32 arrays in
   * backend memory, so a captured CUDA graph replays a step after the host rewrites them. One
   * decode step is N rows of N different sequences; a prefill is T rows of one sequence (or
   * B*T rows of B sequences) with consecutive positions. slot may be NULL: slot[n] = n. */
  /* out(N,C) = wte[tok[n]] + (wpe ? wpe[pos[n]] : 0) */
  void (*embed_pos_fwd)(void *out, const int32_t *tok, const int32_t *pos, const void *wte,
                        const void *wpe, int N, int C);
  /* rope_fwd with row n at position pos[n] (the same cos/sin as rope_fwd at that position) */
  void (*rope_pos_fwd)(void *qkv, const int32_t *pos, int N, int H, int KV, int hd, float theta);
  /* kc[slot[n], h, pos[n], :] = k head h of qkv row n; vc likewise from the v section. */
  void (*kv_append)(void *kc, void *vc, const void *qkv, const int32_t *slot, const int32_t *pos,
                    int N, int H, int KV, int hd, int max_T);
  /* out row n (H*hd) = softmax(q_n K^T / sqrt(hd)) V over keys 0 .. pos[n] of slot[n]'s cache
   * (the row's own key, appended first, included). q_n: the q section of qkv row n. */
  void (*attention_decode)(void *out, const void *qkv, const void *kc, const void *vc,
                           const int32_t *slot, const int32_t *pos, int N, int H, int KV, int hd,
                           int max_T);
  /* out[n] = index of the largest of logits row n's first V entries (the lowest on ties);
   * logits (N, Vp) in the working dtype, out (N) int32 backend memory. */
  void (*argmax_rows)(int32_t *out, const void *logits, int N, int V, int Vp);
  /* Optional (NULL on the CPU): argmax_rows, and then the next decode step's inputs from it:
   * tok[n] = out[n], pos[n] += 1 (device arrays of N), so a step can be queued before the host
   * has read this one's tokens (trainer/model.c: decoding ahead). host_ids (NULL, or the device
   * address of a host_alloc_mapped buffer of 2N ids): the ids are also written there, row n's at
   * host_ids[(pos[n] after the step & 1) * N + n], for the host to read once the step is done
   * without a copy queued behind it. */
  void (*argmax_advance)(int32_t *out, int32_t *tok, int32_t *pos, int32_t *host_ids,
                         const void *logits, int N, int V, int Vp);
  /* out(N,OC) = inp @ w^T + bias (bias may be NULL) for the few rows of a decode step (and the
   * head's rows): matmul_fwd's values up to the order of the fp32 sums, with each output's
   * arithmetic depending only on its own row of inp (not on N or the thread count), so a batch
   * row equals its solo run. CPU: a GEMV that reads each weight row once (sgemm repacks the whole
   * weight on every call, which dominates at one row). CUDA: the decode GEMV for 16-bit tables
   * and at most 8 rows (one pass over the weights, a warp an output), matmul_fwd otherwise. */
  void (*matmul_rows_fwd)(void *out, const void *inp, const void *w, const void *bias, int N,
                          int IC, int OC);
  /* act(N,OC) = gelu(inp @ w^T + bias) for the few rows of a decode step = matmul_rows_fwd into
   * pre, gelu_fwd (the same rounding points; pre may be left unwritten). NULL where the caller
   * composes the two (CPU). */
  void (*matmul_gelu_rows_fwd)(void *act, void *pre, const void *inp, const void *w,
                               const void *bias, int N, int IC, int OC);
  /* Inference norms (prefill and decode rows): rmsnorm_fwd / layernorm_fwd's values without
   * the per-row statistics training keeps for backward, up to the order of the fp32 sums. NULL
   * where the caller takes the training ops (CPU). CUDA: a warp holds its row in registers
   * (16-bit tables, widths a multiple of 8 up to 2048; the training ops otherwise); RMSNorm's
   * values are the bits of the norm inside norm_matmul_fwd's GEMV. */
  void (*rmsnorm_rows_fwd)(void *out, const void *inp, const void *w, int N, int C, float eps);
  void (*layernorm_rows_fwd)(void *out, const void *inp, const void *w, const void *b, int N,
                             int C, float eps);
  /* A GPT-2 decode step's norm + product: out(N,OC) = layernorm(inp; nw, nb) @ w^T + bias, and
   * gelu of that when `gelu` is set; the values of layernorm_rows_fwd into ln followed by
   * matmul_rows_fwd (matmul_gelu_rows_fwd with pre) (nb, bias may be NULL; pre may be NULL
   * without gelu; ln and pre may be left unwritten). CUDA: one GEMV whose prologue norms its
   * rows, for up to 16 rows the GEMV takes; the composition otherwise. NULL where the caller
   * composes the ops (CPU). */
  void (*layernorm_matmul_fwd)(void *out, void *pre, void *ln, const void *inp, const void *nw,
                               const void *nb, const void *w, const void *bias, int N, int IC,
                               int OC, int gelu, float eps);
  /* Decode-step fusions of a llama-style layer (RMSNorm, SwiGLU). Each computes what the plain
   * ops named beside it compute, rounding to the working dtype at the same points; only the
   * order of the fp32 sums inside a product may differ (the CPU composes the plain ops with
   * matmul_rows_fwd for the products; CUDA streams each weight once for a few rows, and
   * composes for more). Scratch buffers (ln (N,IC), pre (N,2F)) hold the composition's
   * intermediates and may be left unwritten.
   * norm_matmul_fwd: out(N,OC) = rmsnorm(inp; nw) @ w^T + bias (bias may be NULL)
   *   = rmsnorm_fwd into ln, matmul_fwd. */
  void (*norm_matmul_fwd)(void *out, void *ln, const void *inp, const void *nw, const void *w,
                          const void *bias, int N, int IC, int OC, float eps);
  /* act(N,F) = swiglu(rmsnorm(inp; nw) @ w^T), w (2F, IC) rows [gate | up]
   *   = rmsnorm_fwd into ln, matmul_fwd into pre, swiglu_fwd. */
  void (*norm_matmul_swiglu_fwd)(void *act, void *pre, void *ln, const void *inp, const void *nw,
                                 const void *w, int N, int IC, int F, float eps);
  /* out(N,OC) = (inp @ w^T + bias) + res = matmul_fwd into out, add_fwd(out, out, res); out must
   * not alias inp or res. */
  void (*matmul_add_fwd)(void *out, const void *inp, const void *w, const void *bias,
                         const void *res, int N, int IC, int OC);
  /* The attention input of a step from the qkv projection raw (N, (H+2KV)*hd): qkv = raw with
   * the q and k heads rmsnorm'd by qnw / knw (hd each; both NULL: no qk norm), rope_pos_fwd,
   * then kv_append (= copy2d of the v section, rmsnorm_fwd of the grouped q and k rows,
   * rope_pos_fwd, kv_append). raw may be qkv itself. */
  void (*qkv_rope_append)(void *qkv, const void *raw, const void *qnw, const void *knw, void *kc,
                          void *vc, const int32_t *slot, const int32_t *pos, int N, int H, int KV,
                          int hd, int max_T, float theta, float eps);
  /* A hint for the decode step: the next decode kernel launched on the current device also asks
   * `bytes` at p (device memory of that device: a later op's weights) into L2 while it runs. No
   * effect on values; a NULL p clears it. CUDA, opt-in: CT_DECODE_PREFETCH=1. NULL in tables
   * without it. */
  void (*l2_hint)(const void *p, size_t bytes);
  /* qkv_rope_append (from raw) then attention_decode (-> out) with the same values, as one
   * kernel where it applies (CUDA, 16-bit, opt-in: CT_DECODE_FUSED_ATT=1); qkv is not written.
   * Returns 0 when it ran, 1 when it does not apply (the caller runs the two ops), -1 on a
   * device error. NULL in tables without it. */
  int (*attention_decode_rope)(void *out, const void *raw, const void *qnw, const void *knw,
                               void *kc, void *vc, const int32_t *slot, const int32_t *pos, int N,
                               int H, int KV, int hd, int max_T, float theta, float eps);
  /* attention_decode_rope (its atty not written) then matmul_add_fwd(out, atty, w, bias, res, N,
   * H*hd, C), as one kernel where it applies (CUDA, 16-bit, thread block clusters (sm_90), opt-in:
   * CT_DECODE_OPROJ=1): the same values up to the order of the projection's fp32 sums (each kv
   * head's columns summed apart, then those shares in kv head order). out must not alias res.
   * Returns as attention_decode_rope. NULL in tables without it. */
  int (*attention_decode_oproj)(void *out, const void *raw, const void *qnw, const void *knw,
                                void *kc, void *vc, const int32_t *slot, const int32_t *pos,
                                const void *w, const void *bias, const void *res, int N, int H,
                                int KV, int hd, int C, int max_T, float theta, float eps);
  /* norm_matmul_fwd(raw, ln, inp, nw, w, bias, N, C, (H + 2*KV)*hd, eps) then
   * attention_decode_rope(out, raw, ...) with the same values, as one kernel where it applies
   * (CUDA, 16-bit, one row, thread block clusters (sm_90), max_T <= 512, opt-in:
   * CT_DECODE_QKV_ATT=1); raw is written, ln is not. Returns as attention_decode_rope. NULL in
   * tables without it. */
  int (*attention_decode_qkv)(void *out, void *raw, const void *inp, const void *nw, const void *w,
                              const void *bias, const void *qnw, const void *knw, void *kc,
                              void *vc, const int32_t *slot, const int32_t *pos, int N, int C,
                              int H, int KV, int hd, int max_T, float theta, float eps);
  /* norm_matmul_fwd(logits, ln, inp, nw, w, NULL, 1, IC, OC, eps) then argmax_advance(out, tok,
   * pos, host_ids, logits, 1, V, OC) (tok NULL: argmax_rows) with the same values and ids, as one
   * kernel for ONE row where it applies (CUDA, 16-bit; the head of a batch-1 decode step: the
   * kernel that would only read the logits back is gone); ln is not written. Returns as
   * attention_decode_rope. NULL in tables without it. */
  int (*norm_matmul_argmax)(void *logits, const void *inp, const void *nw, const void *w, int IC,
                            int OC, float eps, int32_t *out, int32_t *tok, int32_t *pos,
                            int32_t *host_ids, int V);
  /* The whole fused decode step of layers[0 .. nl-1] for ONE row (batch 1): for each layer
   * norm_matmul_fwd (x -> raw), qkv_rope_append (raw -> qkv, cache), attention_decode (-> atty),
   * matmul_add_fwd (-> res2), norm_matmul_swiglu_fwd (-> act), matmul_add_fwd (-> x), with the
   * same values as those ops; CUDA runs them as one persistent kernel. Returns 0 when it ran,
   * 1 when it does not apply (shapes, alignment, device; the caller runs the ops), -1 on a
   * device error. NULL in tables without it. */
  int (*decode_layers)(void *x, void *res2, void *raw, void *qkv, void *atty, void *act,
                       const ct_decode_layer *layers, int nl, const int32_t *slot,
                       const int32_t *pos, int C, int H, int KV, int hd, int F, int max_T,
                       float theta, float eps);

  /* ---- devices (inference across GPUs; NULL where the backend has none) ----
   * set_device makes later ops (and alloc) run on device `dev` with that device's own stream
   * and library handles; returns 0, or -1 (the backend keeps the reason for its check). */
  int (*device_count)(void);
  int (*set_device)(int dev);
  /* free and total bytes of device `dev` */
  int (*device_memory)(int dev, size_t *free_bytes, size_t *total_bytes);
  /* Copies bytes from src on device src_dev to dst on device dst_dev (peer-to-peer where the
   * devices allow it), after the source device's queued work; returns when the copy is done. */
  void (*copy_peer)(void *dst, int dst_dev, const void *src, int src_dev, size_t bytes);
  /* Page-locked host memory (fast, asynchronous copies); NULL on failure. */
  void *(*host_alloc)(size_t bytes);
  /* Optional (NULL on the CPU): page-locked host memory that kernels write directly (mapped
   * into the device's address space, *dev its address there); NULL on failure; host_free frees
   * it. The host reads what a kernel wrote once an event after that kernel is done. */
  void *(*host_alloc_mapped)(size_t bytes, void **dev);
  void (*host_free)(void *p);
  /* dst_host = src (bytes), queued: valid after `sync`. */
  void (*to_host_async)(void *dst_host, const void *src, size_t bytes);
  void (*sync)(void);
  /* Optional (NULL on the CPU): a point in the stream that the host can wait for without
   * waiting for what was queued after it. event_new returns NULL on failure (the error recorded
   * as for any op); event_record marks the stream's current end; event_wait returns when the
   * work queued before the last record is done. */
  void *(*event_new)(void);
  void (*event_record)(void *ev);
  void (*event_wait)(void *ev);
  void (*event_free)(void *ev);
  /* A named point in the stream's timeline (optional, NULL on the CPU): with CT_STEP_MARKS=1 the
   * CUDA backend prints at shutdown the mean stream time from each mark to the next. */
  void (*mark)(const char *name);
  /* Optional (NULL on the CPU): the cuBLAS GEMMs queued from now on aim at n multiprocessors
   * (0: all of them), so collectives overlapping them keep a few SMs without turning a GEMM's
   * single wave into two. */
  void (*gemm_sm_target)(int n);

  /* ---- graph capture (optional: NULL where the backend has none, e.g. the CPU) ----
   * Between graph_begin and graph_end the ops are recorded instead of run; graph_end returns the
   * replayable graph (NULL on failure, the error recorded as for any op). graph_launch replays it
   * with the same pointers and scalar arguments it was recorded with, so whatever changes between
   * replays must live in device memory the graph reads (token ids, targets). Nothing in the
   * recorded region may synchronize with the host (to_host, to_device, sumsq). */
  void (*graph_begin)(void);
  void *(*graph_end)(void);
  void (*graph_launch)(void *graph);
  void (*graph_destroy)(void *graph);

  /* ---- vocab-parallel cross-entropy (parallel/tp.c): each rank holds columns of the logits ----
   * xent_stats: stats (3, N) fp32, for row n over its first V columns of logits (N, Vp):
   *   stats[n] = max, stats[N + n] = sum exp(x - max) (0 and -inf max when V = 0),
   *   stats[2N + n] = x[tgt[n]] (0 when tgt[n] < 0). Reads only.
   * xent_grad: logits overwritten IN PLACE by grad_scale * (exp(x - lse[n]) - [j == tgt[n]]) for
   *   j < V and 0 for the padding columns j >= V (lse[n] = +inf gives a zero row). */
  void (*xent_stats)(float *stats, const void *logits, const int32_t *tgt, int N, int V, int Vp);
  void (*xent_grad)(void *logits, const float *lse, const int32_t *tgt, int N, int V, int Vp,
                    float grad_scale);

  /* Peak memory this process has used so far, in bytes (trainer/memory.c reports it next to
   * the estimate). CPU: peak resident set (getrusage). CUDA: the largest device memory in use
   * (cudaMemGetInfo, context included) seen at an allocation or at this call. */
  size_t (*mem_peak)(void);
} ct_ops;

/* The CPU reference table (always available). `threads` <= 0 keeps the OpenMP default. */
const ct_ops *ct_ops_cpu(void);
void ct_ops_cpu_set_threads(int threads);

#endif

// kernels/cuda/attention_cudnn.cpp — cuDNN fused attention through the cudnn-frontend graph API
// (contract in attention_cudnn.h).
//
// One cuDNN graph per shape and direction: q, k, v are strided views into ctrain's qkv rows
// (dims [B, heads, T, hd], strides [T*W, hd, W, 1] with W = (H + 2*KV)*hd), so neither GQA nor
// the packed layout needs a copy; out and dout are [B, H, T, hd] views of (N, H*hd) rows; stats
// are (B, H, T) fp32. Graphs live in a map keyed by the shape; a miss builds (heuristics mode A,
// the first plan that builds), a hit only binds pointers and executes.
//
// The backward runs cuDNN's default algorithm, which accumulates dQ with floating-point atomics:
// unlike ctrain's own kernels it is not bit-reproducible from run to run. cuDNN's deterministic
// algorithm on Hopper (cuDNN < 9.25) materializes dP, a (B, H, T, T) 16-bit workspace (4 GiB at
// B2 H16 T8192), which defeats the point of fused attention, so it is opt-in:
// CT_CUDA_CUDNN_DETERMINISTIC=1 asks for it (falling back to the default where it cannot be
// built; ct_cudnn_attn_bwd_deterministic says which one a shape got).
#include "kernels/cuda/attention_cudnn.h"

#include <cudnn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <exception>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>

#define CUDNN_FRONTEND_SKIP_JSON_LIB 1
#include <cudnn_frontend.h>

namespace fe = cudnn_frontend;

namespace {

enum : int64_t { U_Q = 1, U_K, U_V, U_O, U_STATS, U_DO, U_DQ, U_DK, U_DV };

struct cached_graph {
  std::shared_ptr<fe::graph::Graph> g;
  int64_t ws = 0;
  int deterministic = 0;
  bool tune = false; // every plan built; the first execution outside a CUDA graph times them
};

// CT_CUDNN_AUTOTUNE=1: build every engine configuration heuristics mode A offers (not only its
// first) and, at a graph's first execution outside CUDA-graph capture, time them all on the real
// buffers (cudnn-frontend's autotune: a warm-up, then runs until one is 5% off its best) and keep
// the fastest; the workspace is sized for the largest plan. Read when a shape's graph is built.
// Measured on an H200 (bench/results/cudnn_autotune_2026-11-30_H200_9688a32.txt): mode A offers
// 2-5 plans a shape, and the timed choice ran no faster than the first (hd 128, T 8192 backward
// 2693-2840 us against 2603-2614), so it stays opt-in. PyTorch's cuDNN there is 9.19 against
// the machine's 9.14; loaded in its place it gave ctrain the same times within the noise.
bool autotune_on() {
  const char *v = getenv("CT_CUDNN_AUTOTUNE");
  return v && !strcmp(v, "1");
}

// Builds g's plans: the heuristic's first, or with autotune_on every one; *ws the workspace.
fe::error_t build_plans(fe::graph::Graph &g, cudnnHandle_t h, cached_graph *out) {
  out->tune = autotune_on();
  fe::error_t e = out->tune ? g.build(h, {fe::HeurMode_t::A}, fe::BuildPlanPolicy_t::ALL)
                            : g.build(h, {fe::HeurMode_t::A});
  if (e.is_bad()) return e;
  if (out->tune) {
    out->ws = g.get_autotune_workspace_size();
    if (getenv("CT_CUDNN_AUTOTUNE_VERBOSE"))
      fprintf(stderr, "cudnn autotune: %lld plans built, workspace %lld bytes\n",
              (long long)g.get_execution_plan_count(), (long long)out->ws);
    return e;
  }
  return g.get_workspace_size(out->ws);
}

typedef std::tuple<int, int, int, int, int, int, int, int> key_t_; // device, bwd, B, T, H, KV, hd, fp16

std::map<key_t_, cached_graph> graphs;
std::map<int, cudnnHandle_t> handles; // per device

key_t_ key_of(const ct_cudnn_attn_shape *s, int bwd) {
  return key_t_(s->device, bwd, s->B, s->T, s->H, s->KV, s->hd, s->fp16);
}

void say(char *err, size_t cap, const std::string &msg) {
  if (err && cap) snprintf(err, cap, "%s", msg.c_str());
}

std::string shape_str(const ct_cudnn_attn_shape *s) {
  char b[128];
  snprintf(b, sizeof b, "B%d T%d H%d KV%d hd%d %s", s->B, s->T, s->H, s->KV, s->hd,
           s->fp16 ? "fp16" : "bf16");
  return b;
}

cudnnHandle_t handle_for(int device, std::string *why) {
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cudnnHandle_t h = nullptr;
  cudnnStatus_t st = cudnnCreate(&h);
  if (st != CUDNN_STATUS_SUCCESS) {
    *why = std::string("cudnnCreate failed: ") + cudnnGetErrorString(st);
    return nullptr;
  }
  handles[device] = h;
  return h;
}

// [B, heads, T, hd] view of a (B*T, row)-strided 16-bit buffer, heads hd apart in a row.
std::shared_ptr<fe::graph::Tensor_attributes> view(fe::graph::Graph &g, const char *name,
                                                   int64_t uid, int64_t B, int64_t heads,
                                                   int64_t T, int64_t hd, int64_t row) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({B, heads, T, hd})
                      .set_stride({T * row, hd, row, 1}));
}

std::shared_ptr<fe::graph::Graph> new_graph(const ct_cudnn_attn_shape *s) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(s->fp16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

// Builds the forward graph: O (and Stats) from strided Q, K, V.
fe::error_t build_fwd(const ct_cudnn_attn_shape *s, cudnnHandle_t h, cached_graph *out) {
  const int64_t B = s->B, T = s->T, H = s->H, KV = s->KV, hd = s->hd, W = (H + 2 * KV) * hd;
  auto g = new_graph(s);
  auto q = view(*g, "q", U_Q, B, H, T, hd, W);
  auto k = view(*g, "k", U_K, B, KV, T, hd, W);
  auto v = view(*g, "v", U_V, B, KV, T, hd, W);
  auto opt = fe::graph::SDPA_attributes()
                 .set_name("ctrain_sdpa")
                 .set_generate_stats(true)
                 .set_attn_scale(1.0f / sqrtf((float)hd))
                 .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                 .set_diagonal_band_right_bound(0);
  auto [o, stats] = g->sdpa(q, k, v, opt);
  o->set_output(true).set_uid(U_O).set_dim({B, H, T, hd}).set_stride({T * H * hd, hd, H * hd, 1});
  stats->set_output(true)
      .set_uid(U_STATS)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim({B, H, T, 1})
      .set_stride({H * T, T, 1, 1});
  fe::error_t e = build_plans(*g, h, out);
  if (e.is_bad()) return e;
  out->g = g;
  return e;
}

fe::error_t build_bwd(const ct_cudnn_attn_shape *s, cudnnHandle_t h, bool deterministic,
                      cached_graph *out) {
  const int64_t B = s->B, T = s->T, H = s->H, KV = s->KV, hd = s->hd, W = (H + 2 * KV) * hd;
  auto g = new_graph(s);
  auto q = view(*g, "q", U_Q, B, H, T, hd, W);
  auto k = view(*g, "k", U_K, B, KV, T, hd, W);
  auto v = view(*g, "v", U_V, B, KV, T, hd, W);
  auto o = view(*g, "o", U_O, B, H, T, hd, H * hd);
  auto dout = view(*g, "dout", U_DO, B, H, T, hd, H * hd);
  auto stats = g->tensor(fe::graph::Tensor_attributes()
                             .set_name("stats")
                             .set_uid(U_STATS)
                             .set_dim({B, H, T, 1})
                             .set_stride({H * T, T, 1, 1})
                             .set_data_type(fe::DataType_t::FLOAT));
  auto opt = fe::graph::SDPA_backward_attributes()
                 .set_name("ctrain_sdpa_bwd")
                 .set_attn_scale(1.0f / sqrtf((float)hd))
                 .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                 .set_diagonal_band_right_bound(0)
                 .set_deterministic_algorithm(deterministic);
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, opt);
  dq->set_output(true).set_uid(U_DQ).set_dim({B, H, T, hd}).set_stride({T * W, hd, W, 1});
  dk->set_output(true).set_uid(U_DK).set_dim({B, KV, T, hd}).set_stride({T * W, hd, W, 1});
  dv->set_output(true).set_uid(U_DV).set_dim({B, KV, T, hd}).set_stride({T * W, hd, W, 1});
  fe::error_t e = build_plans(*g, h, out);
  if (e.is_bad()) return e;
  out->g = g;
  out->deterministic = deterministic;
  return e;
}

// The cached graph of (s, bwd), built on a miss; NULL with the reason in *why.
cached_graph *get(const ct_cudnn_attn_shape *s, int bwd, std::string *why) {
  const key_t_ key = key_of(s, bwd);
  auto it = graphs.find(key);
  if (it != graphs.end()) return &it->second;
  if (cudnnGetVersion() < 90000) {
    *why = "cuDNN " + std::to_string(cudnnGetVersion()) + " is too old (fused attention needs 9.0+)";
    return nullptr;
  }
  cudnnHandle_t h = handle_for(s->device, why);
  if (!h) return nullptr;
  cached_graph c;
  fe::error_t e;
  if (!bwd) {
    e = build_fwd(s, h, &c);
  } else {
    const char *det = getenv("CT_CUDA_CUDNN_DETERMINISTIC");
    std::string det_msg;
    if (det && det[0] && strcmp(det, "0")) {
      e = build_bwd(s, h, true, &c);
      if (e.is_bad()) det_msg = " (deterministic: " + e.get_message() + ")";
    }
    if (!c.g) {
      e = build_bwd(s, h, false, &c);
      if (e.is_bad()) e.err_msg += det_msg;
    }
  }
  if (e.is_bad()) {
    *why = std::string("cuDNN cannot build the attention ") + (bwd ? "backward" : "forward") +
           " graph for " + shape_str(s) + ": " + e.get_message();
    return nullptr;
  }
  return &(graphs[key] = c);
}

int run(cudaStream_t stream, const ct_cudnn_attn_shape *s, int bwd,
        std::unordered_map<int64_t, void *> &pack, void *ws, char *err, size_t errcap) {
  try {
    std::string why;
    cached_graph *c = get(s, bwd, &why);
    if (!c) {
      say(err, errcap, why);
      return -1;
    }
    cudnnHandle_t h = handles[s->device];
    cudnnStatus_t st = cudnnSetStream(h, stream);
    if (st != CUDNN_STATUS_SUCCESS) {
      say(err, errcap, std::string("cudnnSetStream: ") + cudnnGetErrorString(st));
      return -1;
    }
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (c->tune && cudaStreamIsCapturing(stream, &cap) == cudaSuccess &&
        cap == cudaStreamCaptureStatusNone) {
      fe::error_t t = c->g->autotune(h, pack, ws);
      if (t.is_bad()) {
        say(err, errcap, std::string("cuDNN attention autotune ") + shape_str(s) + ": " +
                             t.get_message());
        return -1;
      }
      c->tune = false;
    }
    fe::error_t e = c->g->execute(h, pack, ws);
    if (e.is_bad()) {
      say(err, errcap, std::string("cuDNN attention ") + (bwd ? "backward" : "forward") + " " +
                           shape_str(s) + ": " + e.get_message());
      return -1;
    }
    return 0;
  } catch (const std::exception &x) {
    say(err, errcap, std::string("cuDNN attention: ") + x.what());
    return -1;
  }
}

} // namespace

extern "C" size_t ct_cudnn_attn_runtime_version(void) { return cudnnGetVersion(); }
extern "C" int ct_cudnn_attn_frontend_version(void) { return CUDNN_FRONTEND_VERSION; }

extern "C" int ct_cudnn_attn_plan(const ct_cudnn_attn_shape *s, int bwd, int build,
                                  size_t *workspace_bytes, char *err, size_t errcap) {
  try {
    std::string why;
    if (!build && !graphs.count(key_of(s, bwd))) {
      say(err, errcap, std::string("the cuDNN attention ") + (bwd ? "backward" : "forward") +
                           " graph for " + shape_str(s) +
                           " is not built, and it cannot be built while a CUDA graph is recorded");
      return -1;
    }
    cached_graph *c = get(s, bwd, &why);
    if (!c) {
      say(err, errcap, why);
      return -1;
    }
    if (workspace_bytes) *workspace_bytes = (size_t)c->ws;
    return 0;
  } catch (const std::exception &x) {
    say(err, errcap, std::string("cuDNN attention: ") + x.what());
    return -1;
  }
}

extern "C" int ct_cudnn_attn_fwd(cudaStream_t stream, const ct_cudnn_attn_shape *s, void *out,
                                 float *stats, const void *qkv, void *ws, char *err, size_t errcap) {
  const size_t es = 2, Hd = (size_t)s->H * s->hd, KVd = (size_t)s->KV * s->hd;
  char *base = (char *)const_cast<void *>(qkv);
  std::unordered_map<int64_t, void *> pack = {
      {U_Q, base}, {U_K, base + es * Hd}, {U_V, base + es * (Hd + KVd)},
      {U_O, out},  {U_STATS, stats}};
  return run(stream, s, 0, pack, ws, err, errcap);
}

extern "C" int ct_cudnn_attn_bwd(cudaStream_t stream, const ct_cudnn_attn_shape *s, void *dqkv_tmp,
                                 const void *dout, const void *qkv, const void *o,
                                 const float *stats, void *ws, char *err, size_t errcap) {
  const size_t es = 2, Hd = (size_t)s->H * s->hd, KVd = (size_t)s->KV * s->hd;
  char *base = (char *)const_cast<void *>(qkv), *d = (char *)dqkv_tmp;
  std::unordered_map<int64_t, void *> pack = {
      {U_Q, base},
      {U_K, base + es * Hd},
      {U_V, base + es * (Hd + KVd)},
      {U_O, const_cast<void *>(o)},
      {U_DO, const_cast<void *>(dout)},
      {U_STATS, const_cast<float *>(stats)},
      {U_DQ, d},
      {U_DK, d + es * Hd},
      {U_DV, d + es * (Hd + KVd)}};
  return run(stream, s, 1, pack, ws, err, errcap);
}

extern "C" int ct_cudnn_attn_bwd_deterministic(const ct_cudnn_attn_shape *s) {
  auto it = graphs.find(key_of(s, 1));
  return it == graphs.end() ? -1 : it->second.deterministic;
}

extern "C" void ct_cudnn_attn_release(int device) {
  for (auto it = graphs.begin(); it != graphs.end();)
    it = device < 0 || std::get<0>(it->first) == device ? graphs.erase(it) : std::next(it);
  for (auto it = handles.begin(); it != handles.end();) {
    if (device >= 0 && it->first != device) {
      ++it;
      continue;
    }
    cudnnDestroy(it->second);
    it = handles.erase(it);
  }
}

// parallel/gloo_adapter.cc — the Gloo backend of parallel/comm.h (CPU collectives over TCP).
//
// Written against Debian's libgloo-dev (snapshot 0.0~git20220518, GLOO_VERSION 0.5.0):
//   rendezvous: our ct_store behind gloo::rendezvous::Store, scoped by a PrefixStore, then
//               rendezvous::Context::connectFullMesh over a tcp::Device;
//   collectives: the new-style gloo::allreduce / allgather / broadcast / barrier (option
//               structs, end-to-end timeouts).
//
// Reduce-scatter is an all-reduce of the whole send buffer followed by a copy of this rank's
// block: correct, but it moves 2x the bytes of a real reduce-scatter. The only reduce-scatter
// in this Gloo is the old-style ReduceScatterHalvingDoubling<T>, and it races: a rank other
// than 0 memcpy's its reduced block to the front of the buffer while its send of that front
// region to a peer may still be in flight (run() waits for completion only afterwards). With
// pieces of a few MB over loopback this corrupted results (436 wrong floats of 5M in one run
// of tests/unit/test_comm.c, 2 ranks), so it is not used.
//
// Everything that crosses into C is extern "C" and catches every C++ exception, turning it
// into a ct_status whose message names the call, the rank, the group and Gloo's own text.
//
// Costs, stated openly:
// - bf16 / fp16 have no Gloo type: each call widens the buffer to fp32 (in pieces of at most
//   kWideChunk elements, so scratch stays bounded), reduces in fp32 and rounds back to nearest
//   even once. Traffic is therefore fp32 (2x the bytes of the 16-bit data).
// - reduce-scatter: 2x the traffic (above), and `send` is copied piece by piece (at most
//   kScatterChunk elements, all blocks together) into a scratch buffer that is all-reduced,
//   because `send` must stay unmodified.
// - CT_AVG is a SUM followed by a division by the group size on every rank.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

extern "C" {
#include "common/status.h"
#include "parallel/comm.h"
#include "parallel/store.h"
}

namespace {

// Widening scratch for bf16/fp16: 16 Mi elements = 64 MiB of fp32 at most per call.
constexpr size_t kWideChunk = size_t(1) << 24;
// Elements (all ranks' blocks together) per reduce-scatter piece: 4 Mi = 16 MiB of fp32
// scratch at most.
constexpr size_t kScatterChunk = size_t(1) << 22;

// ---- 16-bit float conversions (round to nearest even; NaN stays NaN) ----

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);  // inf / NaN
  } else if (exp == 0) {
    float f = float(man) * 5.9604644775390625e-8f;  // zero or subnormal: man * 2^-24
    return sign ? -f : f;
  } else {
    u = sign | ((exp + 112u) << 23) | (man << 13);  // rebias 15 -> 127
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (u >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to inf (and inf itself)
  if (u < 0x38800000u) {                         // below 2^-14: subnormal (or zero) half
    float a;
    std::memcpy(&a, &u, 4);
    // a * 2^24 is exact; nearbyint rounds half to even in the default rounding mode. A result
    // of 1024 encodes the smallest normal, which is right.
    return sign | uint16_t(std::nearbyint(a * 16777216.0f));
  }
  u += 0xfffu + ((u >> 13) & 1u);  // round the 13 dropped mantissa bits to nearest even
  u -= 112u << 23;                 // rebias 127 -> 15
  return sign | uint16_t(u >> 13);
}

void widen(ct_dtype dt, const uint16_t *src, float *dst, size_t n) {
  if (dt == CT_BF16)
    for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(src[i]);
  else
    for (size_t i = 0; i < n; i++) dst[i] = f16_to_f32(src[i]);
}

void narrow(ct_dtype dt, const float *src, uint16_t *dst, size_t n) {
  if (dt == CT_BF16)
    for (size_t i = 0; i < n; i++) dst[i] = f32_to_bf16(src[i]);
  else
    for (size_t i = 0; i < n; i++) dst[i] = f32_to_f16(src[i]);
}

// ---- element-wise reductions ----
// Our own rather than gloo::sum<T> & co: those index with `auto i = 0` (an int) and add signed
// integers with overflow UB. Integer sums wrap (computed in the unsigned type). `c` may alias
// `a` or `b`.

template <typename T>
struct Red {
  static T add(T x, T y) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return T(U(x) + U(y));
    } else {
      return x + y;
    }
  }
  static void sum(void *c_, const void *a_, const void *b_, size_t n) {
    T *c = static_cast<T *>(c_);
    const T *a = static_cast<const T *>(a_), *b = static_cast<const T *>(b_);
    for (size_t i = 0; i < n; i++) c[i] = add(a[i], b[i]);
  }
  static void max(void *c_, const void *a_, const void *b_, size_t n) {
    T *c = static_cast<T *>(c_);
    const T *a = static_cast<const T *>(a_), *b = static_cast<const T *>(b_);
    for (size_t i = 0; i < n; i++) c[i] = b[i] > a[i] ? b[i] : a[i];
  }
  static void min(void *c_, const void *a_, const void *b_, size_t n) {
    T *c = static_cast<T *>(c_);
    const T *a = static_cast<const T *>(a_), *b = static_cast<const T *>(b_);
    for (size_t i = 0; i < n; i++) c[i] = b[i] < a[i] ? b[i] : a[i];
  }
  static gloo::AllreduceOptions::Func func(ct_redop op) {
    switch (op) {
      case CT_MAX: return &Red::max;
      case CT_MIN: return &Red::min;
      default: return &Red::sum;  // CT_SUM, and CT_AVG before its division
    }
  }
  // The AVG step: floats divide (correctly rounded), integers truncate toward zero.
  static void divide(T *x, size_t n, int size) {
    for (size_t i = 0; i < n; i++) x[i] = T(x[i] / T(size));
  }
};

// ---- the store bridge ----

// Gloo's view of our store. get() blocks until the key exists (ct_store_get does), as Gloo
// expects. Failures (timeouts, a store that went away) become gloo::IoException carrying our
// message, which the boundary below turns back into a status.
class StoreBridge : public gloo::rendezvous::Store {
 public:
  StoreBridge(ct_store *s, double timeout_s) : s_(s), timeout_s_(timeout_s) {}

  void set(const std::string &key, const std::vector<char> &data) override {
    if (ct_store_set(s_, key.c_str(), data.data(), data.size()) != CT_OK) fail("set", key);
    keys_set_.push_back(key);
  }

  std::vector<char> get(const std::string &key) override {
    void *val = nullptr;
    size_t len = 0;
    if (ct_store_get(s_, key.c_str(), timeout_s_, &val, &len) != CT_OK) fail("get", key);
    std::vector<char> out(static_cast<char *>(val), static_cast<char *>(val) + len);
    std::free(val);
    return out;
  }

  void wait(const std::vector<std::string> &keys) override {
    wait(keys, std::chrono::milliseconds(0));
  }

  void wait(const std::vector<std::string> &keys,
            const std::chrono::milliseconds &timeout) override {
    std::vector<const char *> ks;
    for (const auto &k : keys) ks.push_back(k.c_str());
    // Gloo passes the context's timeout (ours); zero (kNoTimeout) also means ours: no store
    // call is allowed to wait forever.
    double t = timeout.count() > 0 ? double(timeout.count()) / 1000.0 : timeout_s_;
    if (ct_store_wait(s_, ks.data(), int(ks.size()), t) != CT_OK)
      fail("wait", keys.empty() ? std::string() : keys[0]);
  }

  // Keys this rank wrote (full names, prefix included), to delete once every peer has read them.
  const std::vector<std::string> &keys_set() const { return keys_set_; }

 private:
  [[noreturn]] void fail(const char *what, const std::string &key) {
    throw gloo::IoException(std::string("rendezvous store ") + what + " '" + key +
                            "': " + ct_last_error());
  }

  ct_store *s_;
  double timeout_s_;
  std::vector<std::string> keys_set_;
};

// ---- the interface to bind to ----

// Local address whose route reaches `host` (UDP connect sends nothing; getsockname then says
// which source address the kernel would use). Empty when `host` does not resolve.
std::string local_addr_towards(const std::string &host) {
  struct addrinfo hints;
  std::memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  struct addrinfo *res = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || !res) return std::string();
  std::string out;
  for (struct addrinfo *ai = res; ai && out.empty(); ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char buf[INET6_ADDRSTRLEN] = "";
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<struct sockaddr *>(&ss), &sl) == 0) {
      const void *a = ss.ss_family == AF_INET
                          ? static_cast<const void *>(&reinterpret_cast<sockaddr_in *>(&ss)->sin_addr)
                          : static_cast<const void *>(&reinterpret_cast<sockaddr_in6 *>(&ss)->sin6_addr);
      if (inet_ntop(ss.ss_family, a, buf, sizeof buf)) out = buf;
    }
    close(fd);
  }
  freeaddrinfo(res);
  return out;
}

// CTRAIN_SOCKET_IFNAME, else the address that reaches MASTER_ADDR, else the one that reaches
// the store's host, else loopback. `how` says which, for error messages.
gloo::transport::tcp::attr device_attr(ct_store *store, std::string &how) {
  gloo::transport::tcp::attr attr;
  const char *ifname = std::getenv("CTRAIN_SOCKET_IFNAME");
  if (ifname && *ifname) {
    attr.iface = ifname;
    how = std::string("interface ") + ifname + " (CTRAIN_SOCKET_IFNAME)";
    return attr;
  }
  const char *master = std::getenv("MASTER_ADDR");
  if (master && *master) {
    std::string a = local_addr_towards(master);
    if (a.empty())
      throw std::runtime_error(std::string("no local address reaches MASTER_ADDR=") + master +
                               "; set CTRAIN_SOCKET_IFNAME to the interface to use");
    attr.hostname = a;
    how = "address " + a + " (route to MASTER_ADDR=" + master + ")";
    return attr;
  }
  std::string host = ct_store_address(store);  // "HOST:PORT" (IPv6 hosts may be bracketed)
  size_t colon = host.rfind(':');
  if (colon != std::string::npos) host.resize(colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  std::string a = host.empty() ? std::string() : local_addr_towards(host);
  if (a.empty()) a = "127.0.0.1";
  attr.hostname = a;
  how = "address " + a + " (route to the store at " + ct_store_address(store) + ")";
  return attr;
}

// ---- one rank's state of one group ----

struct Group {
  ct_store *store = nullptr;
  int rank = 0, size = 1;
  std::string prefix;
  double timeout_s = 0;
  std::chrono::milliseconds timeout{0};
  std::shared_ptr<gloo::transport::Device> dev;  // shared by a group and its splits
  std::shared_ptr<gloo::rendezvous::Context> ctx;
  std::vector<float> wide;              // fp32 scratch for bf16/fp16 and reduce-scatter
  std::vector<unsigned char> scatter;   // native-type scratch for reduce-scatter
};

ct_status fail(const Group *g, const char *what, const char *msg, ct_status st = CT_ERR_RUNTIME) {
  return ct_set_error(st, "gloo %s failed on rank %d of %d (group '%s'): %s", what, g->rank,
                      g->size, g->prefix.c_str(), msg);
}

// Runs `body` and converts any exception into a status. Gloo throws gloo::IoException for
// transport errors and timeouts, gloo::EnforceNotMet for violated invariants; std::bad_alloc
// for memory; anything else is reported as is.
template <typename F>
ct_status guarded(const Group *g, const char *what, F &&body) {
  try {
    body();
    return CT_OK;
  } catch (const std::bad_alloc &) {
    return fail(g, what, "out of memory", CT_ERR_NOMEM);
  } catch (const std::exception &e) {
    return fail(g, what, e.what());
  } catch (...) {
    return fail(g, what, "unknown C++ exception");
  }
}

// Rendezvous and full-mesh connection of a new group; `g->dev` may already be set (split).
void connect_group(Group *g) {
  std::string how;
  if (!g->dev) {
    gloo::transport::tcp::attr attr = device_attr(g->store, how);
    try {
      g->dev = gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception &e) {
      throw std::runtime_error("cannot bind a TCP device to " + how + ": " + e.what());
    }
  }
  g->ctx = std::make_shared<gloo::rendezvous::Context>(g->rank, g->size);
  g->ctx->setTimeout(g->timeout);  // also bounds the pairs' connect
  StoreBridge bridge(g->store, g->timeout_s);
  gloo::rendezvous::PrefixStore pstore(g->prefix, bridge);
  g->ctx->connectFullMesh(pstore, g->dev);

  // Every peer has read our address once all are connected: a barrier proves it, then each
  // rank removes its own keys, so the store does not grow with every group ever made.
  gloo::BarrierOptions bo(g->ctx);
  bo.setTimeout(g->timeout);
  gloo::barrier(bo);
  for (const auto &k : bridge.keys_set()) ct_store_delete(g->store, k.c_str(), nullptr);
}

size_t dtype_bytes(ct_dtype dt) { return ct_dtype_size(dt); }

// ---- collectives ----

// All-reduce without AVG's division (AVG reduces as SUM here).
template <typename T>
void allreduce_raw(Group *g, T *buf, size_t count, ct_redop op) {
  gloo::AllreduceOptions o(g->ctx);
  o.setOutput(buf, count);
  o.setReduceFunction(Red<T>::func(op));
  o.setTimeout(g->timeout);
  gloo::allreduce(o);
}

template <typename T>
void allreduce_native(Group *g, T *buf, size_t count, ct_redop op) {
  allreduce_raw(g, buf, count, op);
  if (op == CT_AVG) Red<T>::divide(buf, count, g->size);
}

void allreduce_half(Group *g, uint16_t *buf, size_t count, ct_dtype dt, ct_redop op) {
  size_t piece = std::min(count, kWideChunk);
  if (g->wide.size() < piece) g->wide.resize(piece);
  for (size_t off = 0; off < count; off += piece) {
    size_t n = std::min(piece, count - off);
    widen(dt, buf + off, g->wide.data(), n);
    allreduce_native<float>(g, g->wide.data(), n, op);
    narrow(dt, g->wide.data(), buf + off, n);
  }
}

// Reduce-scatter as all-reduce + own block, piece by piece: elements [off, off+m) of every
// rank's block are packed into consecutive blocks of a scratch buffer, all-reduced, and block
// `rank` of the scratch is this rank's result for [off, off+m). In place (recv == send +
// rank*rc) is safe: the piece is packed before recv[off..off+m) is written, and later pieces
// read only beyond it.
template <typename T>
void reduce_scatter_native(Group *g, const T *send, T *recv, size_t rc, ct_redop op) {
  const size_t n = size_t(g->size), r = size_t(g->rank);
  const size_t piece = std::max<size_t>(1, std::min(rc, kScatterChunk / n));
  if (g->scatter.size() < piece * n * sizeof(T)) g->scatter.resize(piece * n * sizeof(T));
  T *work = reinterpret_cast<T *>(g->scatter.data());
  for (size_t off = 0; off < rc; off += piece) {
    size_t m = std::min(piece, rc - off);
    for (size_t b = 0; b < n; b++) std::memcpy(work + b * m, send + b * rc + off, m * sizeof(T));
    allreduce_raw<T>(g, work, m * n, op);
    if (op == CT_AVG) Red<T>::divide(work + r * m, m, g->size);
    std::memcpy(recv + off, work + r * m, m * sizeof(T));
  }
}

void reduce_scatter_half(Group *g, const uint16_t *send, uint16_t *recv, size_t rc, ct_dtype dt,
                         ct_redop op) {
  const size_t n = size_t(g->size), r = size_t(g->rank);
  const size_t piece = std::max<size_t>(1, std::min(rc, kScatterChunk / n));
  if (g->wide.size() < piece * n) g->wide.resize(piece * n);
  float *work = g->wide.data();
  for (size_t off = 0; off < rc; off += piece) {
    size_t m = std::min(piece, rc - off);
    for (size_t b = 0; b < n; b++) widen(dt, send + b * rc + off, work + b * m, m);
    allreduce_raw<float>(g, work, m * n, op);
    if (op == CT_AVG) Red<float>::divide(work + r * m, m, g->size);
    narrow(dt, work + r * m, recv + off, m);
  }
}

}  // namespace

// ---- the C boundary ----

extern "C" {

ct_status ct_comm_gloo_create(ct_store *store, int rank, int world, const char *prefix,
                              double timeout_s, void **impl) {
  *impl = nullptr;
  Group *g = nullptr;
  try {
    g = new Group();
  } catch (...) {
    return ct_set_error(CT_ERR_NOMEM, "gloo init: out of memory");
  }
  g->store = store;
  g->rank = rank;
  g->size = world;
  g->timeout_s = timeout_s;
  g->timeout = std::chrono::milliseconds(std::max<long long>(1, (long long)(timeout_s * 1000.0)));
  ct_status st = guarded(g, "init", [&] {
    g->prefix = prefix;
    connect_group(g);
  });
  if (st != CT_OK) {
    delete g;
    return st;
  }
  *impl = g;
  return CT_OK;
}

static ct_status gloo_split(void *parent_impl, int rank, int size, const char *prefix, void **out) {
  const Group *p = static_cast<const Group *>(parent_impl);
  *out = nullptr;
  Group *g = nullptr;
  try {
    g = new Group();
  } catch (...) {
    return ct_set_error(CT_ERR_NOMEM, "gloo split: out of memory");
  }
  g->store = p->store;
  g->rank = rank;
  g->size = size;
  g->timeout_s = p->timeout_s;
  g->timeout = p->timeout;
  g->dev = p->dev;  // one TCP device (and its event-loop thread) per process
  ct_status st = guarded(g, "split", [&] {
    g->prefix = prefix;
    connect_group(g);
  });
  if (st != CT_OK) {
    delete g;
    return st;
  }
  *out = g;
  return CT_OK;
}

static ct_status gloo_all_reduce(void *impl, void *buf, size_t count, ct_dtype dt, ct_redop op) {
  Group *g = static_cast<Group *>(impl);
  return guarded(g, "all_reduce", [&] {
    switch (dt) {
      case CT_F32: allreduce_native(g, static_cast<float *>(buf), count, op); break;
      case CT_I32: allreduce_native(g, static_cast<int32_t *>(buf), count, op); break;
      case CT_I64: allreduce_native(g, static_cast<int64_t *>(buf), count, op); break;
      case CT_U8: allreduce_native(g, static_cast<uint8_t *>(buf), count, op); break;
      case CT_BF16:
      case CT_F16: allreduce_half(g, static_cast<uint16_t *>(buf), count, dt, op); break;
    }
  });
}

static ct_status gloo_reduce_scatter(void *impl, const void *send, void *recv, size_t rc,
                                     ct_dtype dt, ct_redop op) {
  Group *g = static_cast<Group *>(impl);
  return guarded(g, "reduce_scatter", [&] {
    switch (dt) {
      case CT_F32:
        reduce_scatter_native(g, static_cast<const float *>(send), static_cast<float *>(recv), rc, op);
        break;
      case CT_I32:
        reduce_scatter_native(g, static_cast<const int32_t *>(send), static_cast<int32_t *>(recv), rc, op);
        break;
      case CT_I64:
        reduce_scatter_native(g, static_cast<const int64_t *>(send), static_cast<int64_t *>(recv), rc, op);
        break;
      case CT_U8:
        reduce_scatter_native(g, static_cast<const uint8_t *>(send), static_cast<uint8_t *>(recv), rc, op);
        break;
      case CT_BF16:
      case CT_F16:
        reduce_scatter_half(g, static_cast<const uint16_t *>(send), static_cast<uint16_t *>(recv), rc, dt, op);
        break;
    }
  });
}

static ct_status gloo_all_gather(void *impl, const void *send, void *recv, size_t sc, ct_dtype dt) {
  Group *g = static_cast<Group *>(impl);
  return guarded(g, "all_gather", [&] {
    // Pure data movement: bytes are bytes, whatever the dtype.
    const size_t bytes = sc * dtype_bytes(dt);
    uint8_t *out = static_cast<uint8_t *>(recv);
    gloo::AllgatherOptions o(g->ctx);
    // Without an input Gloo gathers in place from out's own block; with one it copies it there
    // first (memcpy, so the in-place form must not pass it).
    if (static_cast<const uint8_t *>(send) != out + size_t(g->rank) * bytes)
      o.setInput(const_cast<uint8_t *>(static_cast<const uint8_t *>(send)), bytes);
    o.setOutput(out, bytes * size_t(g->size));
    o.setTimeout(g->timeout);
    gloo::allgather(o);
  });
}

static ct_status gloo_broadcast(void *impl, void *buf, size_t count, ct_dtype dt, int root) {
  Group *g = static_cast<Group *>(impl);
  return guarded(g, "broadcast", [&] {
    gloo::BroadcastOptions o(g->ctx);
    o.setOutput(static_cast<uint8_t *>(buf), count * dtype_bytes(dt));
    o.setRoot(root);
    o.setTimeout(g->timeout);
    gloo::broadcast(o);
  });
}

static ct_status gloo_barrier(void *impl) {
  Group *g = static_cast<Group *>(impl);
  return guarded(g, "barrier", [&] {
    gloo::BarrierOptions o(g->ctx);
    o.setTimeout(g->timeout);
    gloo::barrier(o);
  });
}

static void gloo_destroy(void *impl) {
  Group *g = static_cast<Group *>(impl);
  try {
    delete g;  // closes the context's pairs; the device goes with its last group
  } catch (...) {
    // Destructors of a context whose peer died may throw; nothing useful to do with it here.
  }
}

const ct_comm_backend_ops ct_comm_gloo_ops = {
    "gloo",          gloo_split,     gloo_all_reduce, gloo_reduce_scatter,
    gloo_all_gather, gloo_broadcast, gloo_barrier,    gloo_destroy,
};

}  // extern "C"

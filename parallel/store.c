/* parallel/store.c — the TCP key-value store behind parallel/store.h.
 *
 * Wire protocol (all integers little-endian):
 *   frame   = u32 n, then n bytes of payload; payload = u8 op, then fields
 *   str     = u32 len, then len bytes (keys and values alike)
 *   requests                                   replies
 *   'H' u32 version, str token                 'K' | 'R' (refused, then closed)
 *   'S' str key, str value                     'K'
 *   'G' u32 timeout_ms, str key                'V' str value | 'T'
 *   'W' u32 timeout_ms, u32 n, str key * n     'K' | 'T' u32 m, str missing key * m
 *   'A' i64 delta, str key                     'N' i64 value | 'E' str message
 *   'D' str key                                'B' u8 existed
 *   'C' str key                                'B' u8 exists
 * A client has at most one request in flight. The server parks a get/wait whose keys are
 * missing and answers it when a set/add supplies them or its deadline passes, so waiting
 * costs no polling on either side; a client also keeps its own deadline (the server's plus
 * a margin) so a server that went silent is an error, not a hang.
 */
#define _GNU_SOURCE
#include "parallel/store.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"

#define PROTO_VERSION 1u
#define HELLO_MAX 1024         /* frames before authentication are tiny */
#define HELLO_DEADLINE_S 30.0  /* an unauthenticated connection is dropped after this */
#define CLIENT_MARGIN_S 10.0   /* client waits this much past the server's own deadline */
#define FRAME_MAX ((uint64_t)CT_STORE_MAX_VALUE + CT_STORE_MAX_KEY + 64)

static double timeout_or_default(double t) { return t > 0 ? t : CT_STORE_DEFAULT_TIMEOUT_S; }

static uint32_t timeout_ms_of(double t) {
  double ms = t * 1000.0;
  return ms >= 4.0e9 ? 4000000000u : ms < 1 ? 1u : (uint32_t)ms;
}

/* ------------------------------------------------------------------ byte buffers */

typedef struct buf {
  uint8_t *p;
  size_t len, cap, off; /* off: bytes already consumed (read side) or sent (write side) */
} buf;

static bool buf_reserve(buf *b, size_t extra) {
  if (b->len + extra <= b->cap) return true;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + extra) cap *= 2;
  uint8_t *p = realloc(b->p, cap);
  if (!p) return false;
  b->p = p;
  b->cap = cap;
  return true;
}

static bool buf_put(buf *b, const void *src, size_t n) {
  if (!buf_reserve(b, n)) return false;
  if (n) memcpy(b->p + b->len, src, n);
  b->len += n;
  return true;
}

static bool buf_u8(buf *b, uint8_t v) { return buf_put(b, &v, 1); }

static bool buf_u32(buf *b, uint32_t v) {
  uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
  return buf_put(b, x, 4);
}

static bool buf_u64(buf *b, uint64_t v) {
  uint8_t x[8];
  for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
  return buf_put(b, x, 8);
}

static bool buf_str(buf *b, const void *s, size_t n) { return buf_u32(b, (uint32_t)n) && buf_put(b, s, n); }

/* Drops consumed bytes once they dominate the buffer. */
static void buf_compact(buf *b) {
  if (b->off == 0) return;
  if (b->off == b->len) {
    b->len = b->off = 0;
  } else if (b->off > 65536 && b->off * 2 > b->len) {
    memmove(b->p, b->p + b->off, b->len - b->off);
    b->len -= b->off;
    b->off = 0;
  }
}

static void buf_free(buf *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

/* Starts a frame: reserves the length word; frame_end fills it in. */
static size_t frame_begin(buf *b) {
  size_t at = b->len;
  buf_u32(b, 0);
  return at;
}

static bool frame_end(buf *b, size_t at) {
  if (b->len < at + 4) return false; /* an allocation failed on the way */
  uint32_t n = (uint32_t)(b->len - at - 4);
  b->p[at] = (uint8_t)n;
  b->p[at + 1] = (uint8_t)(n >> 8);
  b->p[at + 2] = (uint8_t)(n >> 16);
  b->p[at + 3] = (uint8_t)(n >> 24);
  return true;
}

/* Reader over one received payload. */
typedef struct rd {
  const uint8_t *p;
  size_t n, at;
  bool bad;
} rd;

static uint32_t rd_u32(rd *r) {
  if (r->at + 4 > r->n) { r->bad = true; return 0; }
  const uint8_t *x = r->p + r->at;
  r->at += 4;
  return (uint32_t)x[0] | (uint32_t)x[1] << 8 | (uint32_t)x[2] << 16 | (uint32_t)x[3] << 24;
}

static uint64_t rd_u64(rd *r) {
  if (r->at + 8 > r->n) { r->bad = true; return 0; }
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)r->p[r->at + i] << (8 * i);
  r->at += 8;
  return v;
}

static uint8_t rd_u8(rd *r) {
  if (r->at + 1 > r->n) { r->bad = true; return 0; }
  return r->p[r->at++];
}

/* Points *s at a string field (not NUL-terminated) of length *len. */
static void rd_str(rd *r, const uint8_t **s, size_t *len) {
  uint32_t n = rd_u32(r);
  if (r->bad || r->at + n > r->n) { r->bad = true; *s = NULL; *len = 0; return; }
  *s = r->p + r->at;
  *len = n;
  r->at += n;
}

/* ------------------------------------------------------------------ key table */

/* Chained hash map, FNV-1a, doubled at load factor 1. Keys are NUL-terminated copies. */
typedef struct entry {
  struct entry *next;
  uint64_t hash;
  char *key;
  uint8_t *val;
  size_t len;
} entry;

typedef struct table {
  entry **slots;
  size_t nslots, count;
} table;

static uint64_t fnv1a(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
  return h;
}

static entry *table_find(const table *t, const char *key, size_t klen) {
  if (!t->nslots) return NULL;
  uint64_t h = fnv1a(key, klen);
  for (entry *e = t->slots[h & (t->nslots - 1)]; e; e = e->next)
    if (e->hash == h && strlen(e->key) == klen && !memcmp(e->key, key, klen)) return e;
  return NULL;
}

static bool table_grow(table *t) {
  size_t n = t->nslots ? t->nslots * 2 : 64;
  entry **slots = calloc(n, sizeof *slots);
  if (!slots) return false;
  for (size_t i = 0; i < t->nslots; i++) {
    for (entry *e = t->slots[i], *next; e; e = next) {
      next = e->next;
      e->next = slots[e->hash & (n - 1)];
      slots[e->hash & (n - 1)] = e;
    }
  }
  free(t->slots);
  t->slots = slots;
  t->nslots = n;
  return true;
}

/* Sets key to a copy of val; returns false when out of memory (the table is unchanged). */
static bool table_set(table *t, const char *key, size_t klen, const void *val, size_t len) {
  uint8_t *copy = malloc(len ? len : 1);
  if (!copy) return false;
  if (len) memcpy(copy, val, len);
  entry *e = table_find(t, key, klen);
  if (e) {
    free(e->val);
    e->val = copy;
    e->len = len;
    return true;
  }
  if (t->count >= t->nslots && !table_grow(t)) { free(copy); return false; }
  e = calloc(1, sizeof *e);
  char *k = malloc(klen + 1);
  if (!e || !k) { free(e); free(k); free(copy); return false; }
  memcpy(k, key, klen);
  k[klen] = '\0';
  e->key = k;
  e->hash = fnv1a(key, klen);
  e->val = copy;
  e->len = len;
  e->next = t->slots[e->hash & (t->nslots - 1)];
  t->slots[e->hash & (t->nslots - 1)] = e;
  t->count++;
  return true;
}

static bool table_delete(table *t, const char *key, size_t klen) {
  if (!t->nslots) return false;
  uint64_t h = fnv1a(key, klen);
  for (entry **pp = &t->slots[h & (t->nslots - 1)]; *pp; pp = &(*pp)->next) {
    entry *e = *pp;
    if (e->hash == h && strlen(e->key) == klen && !memcmp(e->key, key, klen)) {
      *pp = e->next;
      free(e->key);
      free(e->val);
      free(e);
      t->count--;
      return true;
    }
  }
  return false;
}

static void table_free(table *t) {
  for (size_t i = 0; i < t->nslots; i++) {
    for (entry *e = t->slots[i], *next; e; e = next) {
      next = e->next;
      free(e->key);
      free(e->val);
      free(e);
    }
  }
  free(t->slots);
  memset(t, 0, sizeof *t);
}

/* Adds delta to the decimal counter at key. Returns 0 on success, 1 if the value is not an
 * integer, -1 when out of memory. */
static int table_add(table *t, const char *key, size_t klen, int64_t delta, int64_t *out) {
  int64_t v = 0;
  entry *e = table_find(t, key, klen);
  if (e) {
    char tmp[32];
    if (e->len == 0 || e->len >= sizeof tmp) return 1;
    memcpy(tmp, e->val, e->len);
    tmp[e->len] = '\0';
    char *end;
    errno = 0;
    long long x = strtoll(tmp, &end, 10);
    if (errno || *end) return 1;
    v = x;
  }
  v += delta;
  char s[32];
  int n = snprintf(s, sizeof s, "%" PRId64, v);
  if (!table_set(t, key, klen, s, (size_t)n)) return -1;
  *out = v;
  return 0;
}

/* ------------------------------------------------------------------ server */

typedef struct conn {
  int fd;
  bool authed, closing; /* closing: flush outbuf, then close */
  double hello_deadline;
  buf in, out;
  /* the parked request, if any (at most one per connection) */
  uint8_t park_op; /* 0, 'G' or 'W' */
  double park_deadline;
  char **park_keys;
  int park_n;
} conn;

struct ct_store_server {
  int listen_fd;
  char token[128];
  table kv;
  conn **conns;
  int nconns, capconns;
  int nparked;
  _Atomic int nclients; /* connections, readable from other threads (stop_when_idle) */
  /* thread mode */
  pthread_t thread;
  bool thread_running;
  int wake[2]; /* self-pipe: stop request */
};

static void sleep_s(double t);

static ct_status sock_error(ct_status s, const char *what, const char *host, int port) {
  return ct_set_error(s, "store: %s %s:%d: %s", what, host && host[0] ? host : "*", port, strerror(errno));
}

static void set_nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

ct_status ct_store_server_start(const char *bind_host, int port, const char *token,
                                ct_store_server **out, int *bound_port) {
  *out = NULL;
  if (port < 0 || port > 65535) return ct_set_error(CT_ERR_USAGE, "store: port %d is out of range 0..65535", port);
  if (token && strlen(token) >= sizeof((ct_store_server *)0)->token)
    return ct_set_error(CT_ERR_USAGE, "store: token longer than 127 characters");
  const char *host = bind_host && bind_host[0] ? bind_host : NULL;
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
  if (!host) hints.ai_family = AF_INET; /* all IPv4 interfaces: what MASTER_ADDR users expect */
  char portstr[16];
  snprintf(portstr, sizeof portstr, "%d", port);
  struct addrinfo *res = NULL;
  int gai = getaddrinfo(host, portstr, &hints, &res);
  if (gai) return ct_set_error(CT_ERR_USAGE, "store: cannot resolve bind address %s: %s", host, gai_strerror(gai));
  int fd = -1, err = 0;
  for (struct addrinfo *a = res; a; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) { err = errno; continue; }
    int one = 1;
    /* SO_REUSEADDR lets a restarted launcher reuse a port in TIME_WAIT; a port with a live
     * listener still fails with EADDRINUSE on Linux. */
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 1024) == 0) break;
    err = errno;
    close(fd);
    fd = -1;
    if (err == EADDRINUSE) break;
  }
  freeaddrinfo(res);
  if (fd < 0) {
    errno = err;
    if (err == EADDRINUSE)
      return ct_set_error(CT_ERR_USAGE, "port %d is already in use (another run on this machine? pick "
                          "another with --master_port / MASTER_PORT, or use --standalone)", port);
    return sock_error(CT_ERR_RUNTIME, "cannot listen on", host, port);
  }
  set_nonblock(fd);
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  int actual = port;
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
    actual = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                            : ((struct sockaddr_in *)&ss)->sin_port);
  ct_store_server *s = calloc(1, sizeof *s);
  if (!s) { close(fd); return ct_set_error(CT_ERR_NOMEM, "store: out of memory"); }
  s->listen_fd = fd;
  s->wake[0] = s->wake[1] = -1;
  if (token) snprintf(s->token, sizeof s->token, "%s", token);
  if (bound_port) *bound_port = actual;
  *out = s;
  return CT_OK;
}

int ct_store_server_nfds(const ct_store_server *s) { return 1 + s->nconns; }

int ct_store_server_poll_fds(ct_store_server *s, struct pollfd *fds, int cap) {
  int n = 0;
  if (n < cap) fds[n++] = (struct pollfd){.fd = s->listen_fd, .events = POLLIN};
  for (int i = 0; i < s->nconns && n < cap; i++) {
    conn *c = s->conns[i];
    short ev = c->out.len > c->out.off ? POLLOUT : 0;
    /* a parked or closing connection is not read, but a client that gave up and closed
     * (POLLRDHUP) is noticed at once rather than at its deadline */
    ev |= !c->closing && !c->park_op ? POLLIN : POLLRDHUP;
    fds[n++] = (struct pollfd){.fd = c->fd, .events = ev};
  }
  return n;
}

int ct_store_server_timeout_ms(const ct_store_server *s) {
  double next = -1;
  for (int i = 0; i < s->nconns; i++) {
    const conn *c = s->conns[i];
    double d = c->park_op ? c->park_deadline : !c->authed ? c->hello_deadline : -1;
    if (d >= 0 && (next < 0 || d < next)) next = d;
  }
  if (next < 0) return -1;
  double ms = (next - ct_now()) * 1000.0;
  return ms <= 0 ? 0 : ms > 1e9 ? 1000000000 : (int)ms + 1;
}

static void conn_unpark(ct_store_server *s, conn *c) {
  for (int i = 0; i < c->park_n; i++) free(c->park_keys[i]);
  free(c->park_keys);
  c->park_keys = NULL;
  c->park_n = 0;
  if (c->park_op) s->nparked--;
  c->park_op = 0;
}

static void conn_close(ct_store_server *s, conn *c) {
  if (c->fd < 0) return;
  conn_unpark(s, c);
  close(c->fd);
  c->fd = -1; /* freed by sweep() */
}

static void sweep(ct_store_server *s) {
  int j = 0;
  for (int i = 0; i < s->nconns; i++) {
    conn *c = s->conns[i];
    if (c->fd >= 0) {
      s->conns[j++] = c;
    } else {
      buf_free(&c->in);
      buf_free(&c->out);
      free(c);
    }
  }
  s->nconns = j;
  s->nclients = j;
}

/* Writes what it can of c->out without blocking. */
static void conn_flush(ct_store_server *s, conn *c) {
  while (c->out.off < c->out.len) {
    ssize_t w = send(c->fd, c->out.p + c->out.off, c->out.len - c->out.off, MSG_NOSIGNAL);
    if (w > 0) {
      c->out.off += (size_t)w;
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;
    } else {
      conn_close(s, c);
      return;
    }
  }
  buf_compact(&c->out);
  if (c->closing) conn_close(s, c);
}

/* Queues a reply frame; an allocation failure drops the connection (the client sees EOF). */
#define REPLY(c, body)                            \
  do {                                            \
    size_t at_ = frame_begin(&(c)->out);          \
    bool ok_ = (body);                            \
    if (!ok_ || !frame_end(&(c)->out, at_)) {     \
      (c)->out.len = at_;                         \
      (c)->closing = true;                        \
    }                                             \
  } while (0)

static bool all_present(ct_store_server *s, conn *c) {
  for (int i = 0; i < c->park_n; i++)
    if (!table_find(&s->kv, c->park_keys[i], strlen(c->park_keys[i]))) return false;
  return true;
}

/* Answers a parked request whose keys now exist. */
static void answer_parked(ct_store_server *s, conn *c) {
  if (c->park_op == 'G') {
    entry *e = table_find(&s->kv, c->park_keys[0], strlen(c->park_keys[0]));
    REPLY(c, buf_u8(&c->out, 'V') && buf_str(&c->out, e->val, e->len));
  } else {
    REPLY(c, buf_u8(&c->out, 'K'));
  }
  conn_unpark(s, c);
}

static void answer_timeout(ct_store_server *s, conn *c) {
  if (c->park_op == 'G') {
    REPLY(c, buf_u8(&c->out, 'T'));
  } else {
    int m = 0;
    for (int i = 0; i < c->park_n; i++)
      if (!table_find(&s->kv, c->park_keys[i], strlen(c->park_keys[i]))) m++;
    size_t at = frame_begin(&c->out);
    bool ok = buf_u8(&c->out, 'T') && buf_u32(&c->out, (uint32_t)m);
    for (int i = 0; ok && i < c->park_n; i++)
      if (!table_find(&s->kv, c->park_keys[i], strlen(c->park_keys[i])))
        ok = buf_str(&c->out, c->park_keys[i], strlen(c->park_keys[i]));
    if (!ok || !frame_end(&c->out, at)) { c->out.len = at; c->closing = true; }
  }
  conn_unpark(s, c);
}

static void conn_process(ct_store_server *s, conn *c);

/* After a key changed: wake every parked request that can now be answered. O(parked) per
 * write — fine for the few thousand ranks a run has. */
static void wake_waiters(ct_store_server *s) {
  if (!s->nparked) return;
  for (int i = 0; i < s->nconns; i++) {
    conn *c = s->conns[i];
    if (c->fd >= 0 && c->park_op && all_present(s, c)) {
      answer_parked(s, c);
      conn_process(s, c); /* flushes, then serves any request queued behind the parked one */
    }
  }
}

static bool const_time_eq(const char *a, size_t alen, const char *b, size_t blen) {
  unsigned diff = alen != blen;
  size_t n = alen < blen ? alen : blen;
  for (size_t i = 0; i < n; i++) diff |= (unsigned)(a[i] ^ b[i]);
  return diff == 0;
}

static bool valid_key(const uint8_t *k, size_t n) {
  return k && n > 0 && n <= CT_STORE_MAX_KEY && !memchr(k, '\0', n);
}

static char *dup_key(const uint8_t *k, size_t n) {
  char *s = malloc(n + 1);
  if (s) { memcpy(s, k, n); s[n] = '\0'; }
  return s;
}

/* Executes one request. Returns false when the connection must be dropped. */
static bool serve_request(ct_store_server *s, conn *c, const uint8_t *p, size_t n) {
  rd r = {.p = p, .n = n};
  uint8_t op = rd_u8(&r);
  if (!c->authed) {
    if (op != 'H') return false;
    uint32_t ver = rd_u32(&r);
    const uint8_t *tok;
    size_t toklen;
    rd_str(&r, &tok, &toklen);
    bool ok = !r.bad && ver == PROTO_VERSION &&
              (!s->token[0] || const_time_eq((const char *)tok, toklen, s->token, strlen(s->token)));
    if (!ok) {
      REPLY(c, buf_u8(&c->out, 'R'));
      c->closing = true;
      return true;
    }
    c->authed = true;
    REPLY(c, buf_u8(&c->out, 'K'));
    return true;
  }
  const uint8_t *key, *val;
  size_t klen, vlen;
  switch (op) {
    case 'S':
      rd_str(&r, &key, &klen);
      rd_str(&r, &val, &vlen);
      if (r.bad || !valid_key(key, klen)) return false;
      if (!table_set(&s->kv, (const char *)key, klen, val, vlen)) return false;
      REPLY(c, buf_u8(&c->out, 'K'));
      wake_waiters(s);
      return true;
    case 'G':
    case 'W': {
      uint32_t ms = rd_u32(&r);
      uint32_t nk = op == 'G' ? 1 : rd_u32(&r);
      if (r.bad || nk == 0 || nk > (uint32_t)(n / 4)) return false;
      char **keys = calloc(nk, sizeof *keys);
      if (!keys) return false;
      for (uint32_t i = 0; i < nk; i++) {
        rd_str(&r, &key, &klen);
        if (r.bad || !valid_key(key, klen) || !(keys[i] = dup_key(key, klen))) {
          for (uint32_t j = 0; j < i; j++) free(keys[j]);
          free(keys);
          return false;
        }
      }
      c->park_op = op;
      c->park_keys = keys;
      c->park_n = (int)nk;
      c->park_deadline = ct_now() + ms / 1000.0;
      s->nparked++;
      if (all_present(s, c)) answer_parked(s, c);
      return true;
    }
    case 'A': {
      int64_t delta = (int64_t)rd_u64(&r);
      rd_str(&r, &key, &klen);
      if (r.bad || !valid_key(key, klen)) return false;
      int64_t v = 0;
      int rc = table_add(&s->kv, (const char *)key, klen, delta, &v);
      if (rc < 0) return false;
      if (rc > 0) {
        static const char msg[] = "value is not an integer counter";
        REPLY(c, buf_u8(&c->out, 'E') && buf_str(&c->out, msg, sizeof msg - 1));
        return true;
      }
      REPLY(c, buf_u8(&c->out, 'N') && buf_u64(&c->out, (uint64_t)v));
      wake_waiters(s);
      return true;
    }
    case 'D':
    case 'C': {
      rd_str(&r, &key, &klen);
      if (r.bad || !valid_key(key, klen)) return false;
      bool yes = op == 'D' ? table_delete(&s->kv, (const char *)key, klen)
                           : table_find(&s->kv, (const char *)key, klen) != NULL;
      REPLY(c, buf_u8(&c->out, 'B') && buf_u8(&c->out, yes));
      return true;
    }
    default:
      return false;
  }
}

/* Executes every complete frame in c->in, stopping at a parked request. */
static void conn_process(ct_store_server *s, conn *c) {
  while (c->fd >= 0 && !c->park_op && !c->closing) {
    size_t avail = c->in.len - c->in.off;
    if (avail < 4) break;
    const uint8_t *h = c->in.p + c->in.off;
    uint64_t n = (uint64_t)h[0] | (uint64_t)h[1] << 8 | (uint64_t)h[2] << 16 | (uint64_t)h[3] << 24;
    if (n == 0 || n > (c->authed ? FRAME_MAX : HELLO_MAX)) { conn_close(s, c); return; }
    if (avail < 4 + n) break;
    c->in.off += 4 + n;
    if (!serve_request(s, c, h + 4, (size_t)n)) { conn_close(s, c); return; }
  }
  if (c->fd >= 0) {
    buf_compact(&c->in);
    conn_flush(s, c);
  }
}

static void conn_read(ct_store_server *s, conn *c) {
  for (;;) {
    if (!buf_reserve(&c->in, 65536)) { conn_close(s, c); return; }
    ssize_t r = recv(c->fd, c->in.p + c->in.len, c->in.cap - c->in.len, 0);
    if (r > 0) {
      size_t room = c->in.cap - c->in.len;
      c->in.len += (size_t)r;
      if ((size_t)r < room) break; /* a short read: the socket is drained for now */
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    conn_close(s, c); /* EOF or error */
    return;
  }
  conn_process(s, c);
}

static void accept_all(ct_store_server *s) {
  for (;;) {
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return; /* EAGAIN, or a transient error (EMFILE, ECONNABORTED): try next poll */
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (s->nconns == s->capconns) {
      int cap = s->capconns ? s->capconns * 2 : 16;
      conn **cs = realloc(s->conns, (size_t)cap * sizeof *cs);
      if (!cs) { close(fd); return; }
      s->conns = cs;
      s->capconns = cap;
    }
    conn *c = calloc(1, sizeof *c);
    if (!c) { close(fd); return; }
    c->fd = fd;
    c->hello_deadline = ct_now() + HELLO_DEADLINE_S;
    s->conns[s->nconns++] = c;
    s->nclients = s->nconns;
  }
}

static conn *find_conn(ct_store_server *s, int fd) {
  for (int i = 0; i < s->nconns; i++)
    if (s->conns[i]->fd == fd) return s->conns[i];
  return NULL;
}

ct_status ct_store_server_handle(ct_store_server *s, const struct pollfd *fds, int n) {
  bool accept_ready = false;
  for (int i = 0; i < n; i++) {
    if (!fds[i].revents) continue;
    if (fds[i].fd == s->listen_fd) {
      if (fds[i].revents & (POLLERR | POLLNVAL))
        return ct_set_error(CT_ERR_RUNTIME, "store: the listening socket failed");
      accept_ready = true;
      continue;
    }
    /* O(clients) lookup per ready fd; a launcher has at most a few hundred local clients. */
    conn *c = find_conn(s, fds[i].fd);
    if (!c) continue;
    if (fds[i].revents & POLLOUT) conn_flush(s, c);
    if (c->fd >= 0 && (fds[i].revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) {
      if (c->park_op || c->closing) {
        /* not reading: a hang-up of a parked client just ends it */
        if (fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) conn_close(s, c);
      } else {
        conn_read(s, c);
      }
    }
  }
  if (accept_ready) accept_all(s);
  /* deadlines: expire parked requests and silent unauthenticated connections */
  double now = ct_now();
  for (int i = 0; i < s->nconns; i++) {
    conn *c = s->conns[i];
    if (c->fd < 0) continue;
    if (c->park_op && now >= c->park_deadline) {
      answer_timeout(s, c);
      conn_flush(s, c);
      if (c->fd >= 0) conn_process(s, c);
    } else if (!c->authed && now >= c->hello_deadline) {
      conn_close(s, c);
    }
  }
  sweep(s);
  return CT_OK;
}

ct_status ct_store_server_local_set(ct_store_server *s, const char *key, const void *val, size_t len) {
  size_t klen = strlen(key);
  if (!valid_key((const uint8_t *)key, klen)) return ct_set_error(CT_ERR_USAGE, "store: invalid key \"%s\"", key);
  if (!table_set(&s->kv, key, klen, val, len)) return ct_set_error(CT_ERR_NOMEM, "store: out of memory setting \"%s\"", key);
  wake_waiters(s);
  sweep(s);
  return CT_OK;
}

ct_status ct_store_server_local_get(ct_store_server *s, const char *key, const void **val,
                                    size_t *len, bool *found) {
  entry *e = table_find(&s->kv, key, strlen(key));
  *found = e != NULL;
  *val = e ? e->val : NULL;
  if (len) *len = e ? e->len : 0;
  return CT_OK;
}

ct_status ct_store_server_local_add(ct_store_server *s, const char *key, int64_t delta, int64_t *new_value) {
  int64_t v = 0;
  int rc = table_add(&s->kv, key, strlen(key), delta, &v);
  if (rc < 0) return ct_set_error(CT_ERR_NOMEM, "store: out of memory adding to \"%s\"", key);
  if (rc > 0) return ct_set_error(CT_ERR_RUNTIME, "store: add on \"%s\": value is not an integer counter", key);
  if (new_value) *new_value = v;
  wake_waiters(s);
  sweep(s);
  return CT_OK;
}

static void *server_thread(void *arg) {
  ct_store_server *s = arg;
  struct pollfd *fds = NULL;
  int cap = 0;
  for (;;) {
    int need = ct_store_server_nfds(s) + 1;
    if (need > cap) {
      struct pollfd *f = realloc(fds, (size_t)need * 2 * sizeof *f);
      if (f) { fds = f; cap = need * 2; }
      else if (!fds) break;
    }
    fds[0] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
    int n = 1 + ct_store_server_poll_fds(s, fds + 1, cap - 1);
    int r = poll(fds, (nfds_t)n, ct_store_server_timeout_ms(s));
    if (r < 0 && errno != EINTR) break;
    if (fds[0].revents) break; /* stop requested */
    if (ct_store_server_handle(s, fds + 1, n - 1) != CT_OK) break;
  }
  free(fds);
  return NULL;
}

ct_status ct_store_server_start_thread(ct_store_server *s) {
  if (s->thread_running) return CT_OK;
  if (pipe2(s->wake, O_CLOEXEC) != 0) return ct_set_error(CT_ERR_RUNTIME, "store: pipe: %s", strerror(errno));
  int rc = pthread_create(&s->thread, NULL, server_thread, s);
  if (rc) {
    close(s->wake[0]);
    close(s->wake[1]);
    s->wake[0] = s->wake[1] = -1;
    return ct_set_error(CT_ERR_RUNTIME, "store: cannot start the server thread: %s", strerror(rc));
  }
  s->thread_running = true;
  return CT_OK;
}

void ct_store_server_stop_when_idle(ct_store_server *s, double timeout_s) {
  if (!s) return;
  double deadline = ct_now() + timeout_or_default(timeout_s);
  /* Polls a counter every 10 ms: this runs once per process, at exit. */
  while (s->thread_running && s->nclients > 0 && ct_now() < deadline) sleep_s(0.01);
  ct_store_server_stop(s);
}

void ct_store_server_stop(ct_store_server *s) {
  if (!s) return;
  if (s->thread_running) {
    ssize_t w = write(s->wake[1], "x", 1);
    (void)w;
    pthread_join(s->thread, NULL);
  }
  if (s->wake[0] >= 0) close(s->wake[0]);
  if (s->wake[1] >= 0) close(s->wake[1]);
  for (int i = 0; i < s->nconns; i++) conn_close(s, s->conns[i]);
  sweep(s);
  free(s->conns);
  close(s->listen_fd);
  table_free(&s->kv);
  free(s);
}

/* ------------------------------------------------------------------ client */

struct ct_store {
  int fd;
  bool broken; /* a reply went missing: the stream is out of step, every call fails */
  char host[256];
  int port;
  char token[128];
  char addr[300]; /* "host:port" */
  char prefix[256];
  double io_s; /* ct_store_set_io_timeout; 0 = the defaults below */
  pthread_mutex_t mu;
  buf out, in;
};

/* How long a quick request (set, add, check, delete, the send of any request) may take, and
 * how long past the server's own deadline a get/wait waits for its answer. */
static double quick_s(const ct_store *s) { return s->io_s > 0 ? s->io_s : 60.0; }
static double margin_s(const ct_store *s) { return s->io_s > 0 && s->io_s < CLIENT_MARGIN_S ? s->io_s : CLIENT_MARGIN_S; }

static ct_status lost(ct_store *s, const char *what) {
  s->broken = true;
  return ct_set_error(CT_ERR_RUNTIME, "store at %s: %s (did the launcher or rank 0 exit?)", s->addr, what);
}

static ct_status send_all(ct_store *s, const uint8_t *p, size_t n, double deadline) {
  while (n) {
    ssize_t w = send(s->fd, p, n, MSG_NOSIGNAL);
    if (w > 0) { p += w; n -= (size_t)w; continue; }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      double left = deadline - ct_now();
      if (left <= 0) return lost(s, "sending timed out");
      struct pollfd pf = {.fd = s->fd, .events = POLLOUT};
      poll(&pf, 1, (int)(left * 1000) + 1);
      continue;
    }
    return lost(s, w == 0 ? "connection closed" : strerror(errno));
  }
  return CT_OK;
}

/* Reads exactly n bytes into dst before the deadline. *eof_clean is set when the peer closed
 * before the first byte (used to tell "refused" from a broken stream at hello time). */
static ct_status recv_all(ct_store *s, uint8_t *dst, size_t n, double deadline, const char *waiting_for) {
  const double started = ct_now();
  while (n) {
    ssize_t r = recv(s->fd, dst, n, MSG_DONTWAIT);
    if (r > 0) { dst += r; n -= (size_t)r; continue; }
    if (r == 0) return lost(s, "the server closed the connection");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return lost(s, strerror(errno));
    double left = deadline - ct_now();
    if (left <= 0) {
      s->broken = true;
      return ct_set_error(CT_ERR_RUNTIME, "store at %s did not answer %s within %.1f s (server hung "
                          "or unreachable)", s->addr, waiting_for, ct_now() - started);
    }
    struct pollfd pf = {.fd = s->fd, .events = POLLIN};
    poll(&pf, 1, left > 1e6 ? 1000000000 : (int)(left * 1000) + 1);
  }
  return CT_OK;
}

/* Sends the frame in s->out and reads one reply payload into s->in (s->in.p[0] is the op). */
static ct_status roundtrip(ct_store *s, double reply_deadline, const char *what) {
  if (s->broken) return ct_set_error(CT_ERR_RUNTIME, "store at %s: connection unusable after an earlier error", s->addr);
  ct_status st = send_all(s, s->out.p, s->out.len, ct_now() + quick_s(s));
  s->out.len = 0;
  if (st) return st;
  uint8_t h[4];
  CT_TRY(recv_all(s, h, 4, reply_deadline, what));
  uint32_t n = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
  if (n == 0 || n > FRAME_MAX) return lost(s, "malformed reply");
  s->in.len = 0;
  if (!buf_reserve(&s->in, n)) return ct_set_error(CT_ERR_NOMEM, "store: out of memory reading a %u-byte reply", n);
  CT_TRY(recv_all(s, s->in.p, n, reply_deadline, what));
  s->in.len = n;
  return CT_OK;
}

static int connect_deadline(int fd, const struct sockaddr *a, socklen_t alen, double deadline) {
  set_nonblock(fd);
  if (connect(fd, a, alen) == 0) return 0;
  if (errno != EINPROGRESS) return -1;
  for (;;) {
    double left = deadline - ct_now();
    if (left <= 0) { errno = ETIMEDOUT; return -1; }
    struct pollfd pf = {.fd = fd, .events = POLLOUT};
    int r = poll(&pf, 1, (int)(left * 1000) + 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) { errno = ETIMEDOUT; return -1; }
    int err = 0;
    socklen_t el = sizeof err;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
    if (err) { errno = err; return -1; }
    return 0;
  }
}

static void sleep_s(double t) {
  struct timespec ts = {(time_t)t, (long)((t - (time_t)t) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

ct_status ct_store_connect(const char *host, int port, const char *token, double timeout_s, ct_store **out) {
  *out = NULL;
  if (!host || !host[0]) return ct_set_error(CT_ERR_USAGE, "store: no host to connect to (MASTER_ADDR unset?)");
  if (port <= 0 || port > 65535) return ct_set_error(CT_ERR_USAGE, "store: port %d is out of range 1..65535", port);
  ct_store *s = calloc(1, sizeof *s);
  if (!s) return ct_set_error(CT_ERR_NOMEM, "store: out of memory");
  s->fd = -1;
  snprintf(s->host, sizeof s->host, "%s", host);
  s->port = port;
  snprintf(s->token, sizeof s->token, "%s", token ? token : "");
  snprintf(s->addr, sizeof s->addr, "%s:%d", host, port);
  pthread_mutex_init(&s->mu, NULL);

  timeout_s = timeout_or_default(timeout_s);
  double start = ct_now(), deadline = start + timeout_s, backoff = 0.02;
  char last[256] = "no attempt";
  char portstr[16];
  snprintf(portstr, sizeof portstr, "%d", port);
  for (;;) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int gai = getaddrinfo(host, portstr, &hints, &res);
    if (gai) {
      snprintf(last, sizeof last, "cannot resolve %s: %s", host, gai_strerror(gai));
    } else {
      for (struct addrinfo *a = res; a && s->fd < 0; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) { snprintf(last, sizeof last, "%s", strerror(errno)); continue; }
        double slice = deadline - ct_now();
        if (slice > 5) slice = 5;  /* one unreachable address must not eat the whole timeout */
        if (slice < 0.05) slice = 0.05;
        if (connect_deadline(fd, a->ai_addr, a->ai_addrlen, ct_now() + slice) == 0) {
          s->fd = fd;
        } else {
          snprintf(last, sizeof last, "%s", strerror(errno));
          close(fd);
        }
      }
      freeaddrinfo(res);
    }
    if (s->fd >= 0) {
      int one = 1;
      setsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      size_t at = frame_begin(&s->out);
      bool ok = buf_u8(&s->out, 'H') && buf_u32(&s->out, PROTO_VERSION) &&
                buf_str(&s->out, s->token, strlen(s->token)) && frame_end(&s->out, at);
      if (!ok) { ct_store_close(s); return ct_set_error(CT_ERR_NOMEM, "store: out of memory"); }
      double hd = deadline - ct_now();
      if (hd < 10) hd = 10;
      ct_status st = roundtrip(s, ct_now() + hd, "the hello");
      if (st == CT_OK && s->in.p[0] == 'K') {
        *out = s;
        return CT_OK;
      }
      /* A server that answers 'R' or closes the connection straight after accepting it is
       * refusing our token; anything else is a broken stream. */
      bool refused = st == CT_OK ? s->in.p[0] == 'R' : strstr(ct_last_error(), "closed the connection") != NULL;
      ct_status rs = refused ? ct_set_error(CT_ERR_RUNTIME, "store at %s refused the connection: wrong token",
                                            s->addr)
                             : ct_set_error(CT_ERR_RUNTIME, "store at %s: handshake failed: %s", s->addr,
                                            st ? ct_last_error() : "unexpected reply");
      ct_store_close(s);
      return rs;
    }
    double left = deadline - ct_now();
    if (left <= 0) break;
    sleep_s(backoff < left ? backoff : left); /* one last attempt right at the deadline */
    backoff = backoff * 2 > 1.0 ? 1.0 : backoff * 2;
  }
  ct_store_close(s);
  return ct_set_error(CT_ERR_RUNTIME, "could not connect to the store at %s:%d within %.1f s: %s (is the "
                      "launcher or rank 0 running, and are MASTER_ADDR / MASTER_PORT right?)",
                      host, port, timeout_s, last);
}

ct_status ct_store_clone(ct_store *s, double timeout_s, ct_store **out) {
  CT_TRY(ct_store_connect(s->host, s->port, s->token, timeout_s, out));
  snprintf((*out)->prefix, sizeof (*out)->prefix, "%s", s->prefix);
  return CT_OK;
}

const char *ct_store_address(const ct_store *s) { return s->addr; }

void ct_store_set_io_timeout(ct_store *s, double seconds) {
  pthread_mutex_lock(&s->mu);
  s->io_s = seconds > 0 ? seconds : 0;
  pthread_mutex_unlock(&s->mu);
}

void ct_store_close(ct_store *s) {
  if (!s) return;
  if (s->fd >= 0) close(s->fd);
  pthread_mutex_destroy(&s->mu);
  buf_free(&s->out);
  buf_free(&s->in);
  free(s);
}

static ct_status check_key(const ct_store *s, const char *key) {
  if (!key) return ct_set_error(CT_ERR_USAGE, "store: NULL key");
  size_t n = strlen(key) + strlen(s->prefix);
  if (strlen(key) == 0 || n > CT_STORE_MAX_KEY)
    return ct_set_error(CT_ERR_USAGE, "store: key of %zu bytes with its prefix (must be 1..%d)", n, CT_STORE_MAX_KEY);
  return CT_OK;
}

/* Appends the prefixed key as a str field. */
static bool buf_key(ct_store *s, const char *key) {
  size_t pl = strlen(s->prefix), kl = strlen(key);
  return buf_u32(&s->out, (uint32_t)(pl + kl)) && buf_put(&s->out, s->prefix, pl) && buf_put(&s->out, key, kl);
}

ct_status ct_store_set_prefix(ct_store *s, const char *prefix) {
  if (prefix && strlen(prefix) >= sizeof s->prefix)
    return ct_set_error(CT_ERR_USAGE, "store: key prefix longer than %zu bytes", sizeof s->prefix - 1);
  pthread_mutex_lock(&s->mu);
  snprintf(s->prefix, sizeof s->prefix, "%s", prefix ? prefix : "");
  pthread_mutex_unlock(&s->mu);
  return CT_OK;
}

/* A reply of the wrong kind: only a foreign or buggy server sends one. */
static ct_status unexpected(ct_store *s, const char *call) { return lost(s, call); }

/* Quick round trip for requests the server answers at once. */
#define QUICK_DEADLINE() (ct_now() + quick_s(s))

ct_status ct_store_set(ct_store *s, const char *key, const void *val, size_t len) {
  CT_TRY(check_key(s, key));
  if (len > CT_STORE_MAX_VALUE)
    return ct_set_error(CT_ERR_USAGE, "store: value for \"%s\" is %zu bytes (limit %u)", key, len, CT_STORE_MAX_VALUE);
  pthread_mutex_lock(&s->mu);
  size_t at = frame_begin(&s->out);
  bool ok = buf_u8(&s->out, 'S') && buf_key(s, key) && buf_str(&s->out, val, len) &&
            frame_end(&s->out, at);
  ct_status st = ok ? roundtrip(s, QUICK_DEADLINE(), "a set") : ct_set_error(CT_ERR_NOMEM, "store: out of memory");
  s->out.len = 0;
  if (st == CT_OK && s->in.p[0] != 'K') st = unexpected(s, "unexpected reply to set");
  if (st) ct_add_context(st, "set \"%s\": ", key);
  pthread_mutex_unlock(&s->mu);
  return st;
}

ct_status ct_store_get(ct_store *s, const char *key, double timeout_s, void **val, size_t *len) {
  *val = NULL;
  if (len) *len = 0;
  CT_TRY(check_key(s, key));
  timeout_s = timeout_or_default(timeout_s);
  pthread_mutex_lock(&s->mu);
  size_t at = frame_begin(&s->out);
  bool ok = buf_u8(&s->out, 'G') && buf_u32(&s->out, timeout_ms_of(timeout_s)) &&
            buf_key(s, key) && frame_end(&s->out, at);
  double start = ct_now();
  ct_status st = ok ? roundtrip(s, start + timeout_s + margin_s(s), "a get")
                    : ct_set_error(CT_ERR_NOMEM, "store: out of memory");
  s->out.len = 0;
  if (st == CT_OK) {
    if (s->in.p[0] == 'T') {
      st = ct_set_error(CT_ERR_RUNTIME, "store at %s: get \"%s\" timed out after %.1f s: the key was never set",
                        s->addr, key, ct_now() - start);
    } else if (s->in.p[0] == 'V') {
      rd r = {.p = s->in.p + 1, .n = s->in.len - 1};
      const uint8_t *v;
      size_t vlen;
      rd_str(&r, &v, &vlen);
      uint8_t *copy = r.bad ? NULL : malloc(vlen + 1);
      if (r.bad) {
        st = lost(s, "malformed reply to get");
      } else if (!copy) {
        st = ct_set_error(CT_ERR_NOMEM, "store: out of memory for a %zu-byte value", vlen);
      } else {
        memcpy(copy, v, vlen);
        copy[vlen] = 0;
        *val = copy;
        if (len) *len = vlen;
      }
    } else {
      st = unexpected(s, "unexpected reply to get");
    }
  }
  if (st && !strstr(ct_last_error(), "timed out after")) ct_add_context(st, "get \"%s\": ", key);
  pthread_mutex_unlock(&s->mu);
  return st;
}

ct_status ct_store_wait(ct_store *s, const char *const *keys, int n, double timeout_s) {
  if (n <= 0) return CT_OK;
  for (int i = 0; i < n; i++) CT_TRY(check_key(s, keys[i]));
  timeout_s = timeout_or_default(timeout_s);
  pthread_mutex_lock(&s->mu);
  size_t at = frame_begin(&s->out);
  bool ok = buf_u8(&s->out, 'W') && buf_u32(&s->out, timeout_ms_of(timeout_s)) && buf_u32(&s->out, (uint32_t)n);
  for (int i = 0; ok && i < n; i++) ok = buf_key(s, keys[i]);
  ok = ok && frame_end(&s->out, at);
  double start = ct_now();
  ct_status st = ok ? roundtrip(s, start + timeout_s + margin_s(s), "a wait")
                    : ct_set_error(CT_ERR_NOMEM, "store: out of memory");
  s->out.len = 0;
  if (st == CT_OK && s->in.p[0] == 'T') {
    /* list the missing keys: at most 8, then a count */
    char list[1024] = "";
    size_t used = 0;
    rd r = {.p = s->in.p + 1, .n = s->in.len - 1};
    uint32_t m = rd_u32(&r);
    for (uint32_t i = 0; i < m && !r.bad; i++) {
      const uint8_t *k;
      size_t kl;
      rd_str(&r, &k, &kl);
      if (r.bad || i >= 8) continue;
      size_t pl = strlen(s->prefix);
      if (kl >= pl && !memcmp(k, s->prefix, pl)) { k += pl; kl -= pl; } /* name keys as the caller did */
      int w = snprintf(list + used, sizeof list - used, "%s\"%.*s\"", i ? ", " : "", (int)(kl > 200 ? 200 : kl), k);
      if (w > 0 && used + (size_t)w < sizeof list) used += (size_t)w;
    }
    if (m > 8 && used < sizeof list) snprintf(list + used, sizeof list - used, " and %u more", m - 8);
    st = ct_set_error(CT_ERR_RUNTIME, "store at %s: wait timed out after %.1f s: %u of %d key(s) never set: %s",
                      s->addr, ct_now() - start, m, n, list);
  } else if (st == CT_OK && s->in.p[0] != 'K') {
    st = unexpected(s, "unexpected reply to wait");
  }
  pthread_mutex_unlock(&s->mu);
  return st;
}

ct_status ct_store_add(ct_store *s, const char *key, int64_t delta, int64_t *new_value) {
  CT_TRY(check_key(s, key));
  pthread_mutex_lock(&s->mu);
  size_t at = frame_begin(&s->out);
  bool ok = buf_u8(&s->out, 'A') && buf_u64(&s->out, (uint64_t)delta) && buf_key(s, key) &&
            frame_end(&s->out, at);
  ct_status st = ok ? roundtrip(s, QUICK_DEADLINE(), "an add") : ct_set_error(CT_ERR_NOMEM, "store: out of memory");
  s->out.len = 0;
  if (st == CT_OK) {
    rd r = {.p = s->in.p + 1, .n = s->in.len - 1};
    if (s->in.p[0] == 'N') {
      int64_t v = (int64_t)rd_u64(&r);
      if (r.bad) st = lost(s, "malformed reply to add");
      else if (new_value) *new_value = v;
    } else if (s->in.p[0] == 'E') {
      st = ct_set_error(CT_ERR_RUNTIME, "store at %s: value is not an integer counter", s->addr);
    } else {
      st = unexpected(s, "unexpected reply to add");
    }
  }
  if (st) ct_add_context(st, "add \"%s\": ", key);
  pthread_mutex_unlock(&s->mu);
  return st;
}

static ct_status bool_request(ct_store *s, uint8_t op, const char *key, bool *out, const char *what) {
  CT_TRY(check_key(s, key));
  pthread_mutex_lock(&s->mu);
  size_t at = frame_begin(&s->out);
  bool ok = buf_u8(&s->out, op) && buf_key(s, key) && frame_end(&s->out, at);
  ct_status st = ok ? roundtrip(s, QUICK_DEADLINE(), what) : ct_set_error(CT_ERR_NOMEM, "store: out of memory");
  s->out.len = 0;
  if (st == CT_OK) {
    if (s->in.p[0] == 'B' && s->in.len >= 2) {
      if (out) *out = s->in.p[1] != 0;
    } else {
      st = unexpected(s, "unexpected reply");
    }
  }
  if (st) ct_add_context(st, "%s \"%s\": ", what, key);
  pthread_mutex_unlock(&s->mu);
  return st;
}

ct_status ct_store_delete(ct_store *s, const char *key, bool *existed) {
  return bool_request(s, 'D', key, existed, "delete");
}

ct_status ct_store_check(ct_store *s, const char *key, bool *exists) {
  return bool_request(s, 'C', key, exists, "check");
}

ct_status ct_store_barrier(ct_store *s, const char *name, int rank, int world, double timeout_s) {
  if (world <= 0 || rank < 0 || rank >= world)
    return ct_set_error(CT_ERR_USAGE, "store: barrier \"%s\": rank %d of world %d", name, rank, world);
  timeout_s = timeout_or_default(timeout_s);
  double start = ct_now();
  char key[CT_STORE_MAX_KEY + 1];
  /* The k-th arrival overall belongs to generation (k-1)/world; the last arrival of a
   * generation publishes its "done" key. Each rank also leaves an arrival mark so a timeout can
   * name the ranks that never came. Costs world+2 keys per barrier; they are never deleted
   * (a late reader of an old generation must still find "done"). */
  snprintf(key, sizeof key, "ct/barrier/%s/count", name);
  int64_t k = 0;
  CT_TRY(ct_store_add(s, key, 1, &k));
  int64_t gen = (k - 1) / world;
  snprintf(key, sizeof key, "ct/barrier/%s/%" PRId64 "/rank%d", name, gen, rank);
  CT_TRY(ct_store_set(s, key, "", 0));
  char done[CT_STORE_MAX_KEY + 1];
  snprintf(done, sizeof done, "ct/barrier/%s/%" PRId64 "/done", name, gen);
  if (k % world == 0) CT_TRY(ct_store_set(s, done, "1", 1));
  const char *keys[1] = {done};
  double left = timeout_s - (ct_now() - start);
  ct_status st = ct_store_wait(s, keys, 1, left > 0.001 ? left : 0.001);
  if (st == CT_OK) return CT_OK;
  if (!strstr(ct_last_error(), "wait timed out")) return st;
  /* name the missing ranks */
  char missing[512] = "";
  size_t used = 0;
  int nmissing = 0;
  for (int r = 0; r < world; r++) {
    bool there = false;
    snprintf(key, sizeof key, "ct/barrier/%s/%" PRId64 "/rank%d", name, gen, r);
    if (ct_store_check(s, key, &there) != CT_OK) break;
    if (there) continue;
    if (nmissing < 16) {
      int w = snprintf(missing + used, sizeof missing - used, "%s%d", nmissing ? ", " : "", r);
      if (w > 0 && used + (size_t)w < sizeof missing) used += (size_t)w;
    }
    nmissing++;
  }
  if (nmissing > 16 && used < sizeof missing) snprintf(missing + used, sizeof missing - used, ", ...");
  return ct_set_error(CT_ERR_RUNTIME, "store at %s: barrier \"%s\" timed out after %.1f s on rank %d: %d of %d "
                      "ranks arrived; missing rank%s %s", s->addr, name, ct_now() - start, rank,
                      world - nmissing, world, nmissing == 1 ? "" : "s", missing);
}

ct_status ct_store_make_token(char *out) {
  uint8_t b[16];
  size_t got = 0;
  while (got < sizeof b) {
    ssize_t r = getrandom(b + got, sizeof b - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ct_set_error(CT_ERR_RUNTIME, "store: getrandom: %s", strerror(errno));
    got += (size_t)r;
  }
  static const char hex[] = "0123456789abcdef";
  for (int i = 0; i < 16; i++) {
    out[2 * i] = hex[b[i] >> 4];
    out[2 * i + 1] = hex[b[i] & 15];
  }
  out[CT_STORE_TOKEN_LEN] = '\0';
  return CT_OK;
}

/* Device maps on the CPU: the inference engine spread over "virtual devices" (the CPU table with
 * device_count / set_device / device_memory / copy_peer added by this test) gives the bits of
 * one device, and the placement planner (ct_infer_plan) puts layers where its spec says.
 *
 * Each virtual device's memory is its own mmap'ed blocks, and set_device makes every other
 * device's blocks inaccessible (mprotect PROT_NONE): an op that touches another device's
 * memory, as a GPU kernel reading a peer's pointer would, stops the test with a message naming
 * both devices. copy_peer is the only way across, and it checks that each pointer lives on the
 * device it is said to. So the multi-GPU logic of trainer/model.c (which device holds which
 * layer's weights and KV cache, the tied head's copy, the hidden states' hops, the outputs read
 * from the last device) runs in CI without a GPU; tests/gpu/generate_gpu.sh checks the same
 * on two real GPUs. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ct_test.h"
#include "trainer/config.h"
#include "trainer/generate.h"
#include "trainer/model.h"
#include "tiny_model.h"

/* ---- the virtual-device table ---- */

enum { VMAX = 4, VBLOCKS = 4096 };
typedef struct {
  char *p;
  size_t len;
  int dev;
} vblock;

static vblock blocks[VBLOCKS];
static int nblocks;
static int vndev = 2, vcur = 0;
static size_t vfree_bytes[VMAX];    /* what device_memory reports as free */
static size_t vused[VMAX];          /* bytes allocated now, per device */
static long vhops;                  /* copy_peer calls */
static int vbad_peer;               /* copy_peer calls with a pointer on the wrong device */
static ct_ops vops;

static vblock *find_block(const void *p) {
  for (int i = 0; i < nblocks; i++)
    if ((const char *)p >= blocks[i].p && (const char *)p < blocks[i].p + blocks[i].len)
      return &blocks[i];
  return NULL;
}

/* Only the current device's blocks are readable and writable. */
static void protect_all(void) {
  for (int i = 0; i < nblocks; i++)
    if (mprotect(blocks[i].p, blocks[i].len,
                 blocks[i].dev == vcur ? PROT_READ | PROT_WRITE : PROT_NONE) != 0) {
      perror("mprotect");
      exit(1);
    }
}

static void on_segv(int sig, siginfo_t *si, void *ctx) {
  (void)sig, (void)ctx;
  const vblock *b = find_block(si->si_addr);
  char msg[256];
  int n = b ? snprintf(msg, sizeof msg, "device discipline broken: an op touched virtual device"
                       " %d's memory (a block of %zu bytes) while device %d was current\n",
                       b->dev, b->len, vcur)
            : snprintf(msg, sizeof msg, "segmentation fault outside the virtual devices' memory"
                       " (at %p)\n", si->si_addr);
  if (write(2, msg, (size_t)n) < 0) _exit(2);
  _exit(1);
}

static size_t page_round(size_t bytes) {
  const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  return (bytes ? (bytes + pg - 1) / pg : 1) * pg;
}

static void *v_alloc(size_t bytes) {
  if (nblocks == VBLOCKS) return NULL;
  const size_t len = page_round(bytes);
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  blocks[nblocks++] = (vblock){p, len, vcur};
  vused[vcur] += len;
  return p; /* anonymous pages start zeroed, as the CPU table's alloc */
}

static void v_free(void *p) {
  if (!p) return;
  for (int i = 0; i < nblocks; i++)
    if (blocks[i].p == p) {
      vused[blocks[i].dev] -= blocks[i].len;
      munmap(p, blocks[i].len);
      blocks[i] = blocks[--nblocks];
      return;
    }
  fprintf(stderr, "v_free: %p was not allocated by the virtual devices\n", p);
  exit(1);
}

static int v_device_count(void) { return vndev; }
static int v_set_device(int dev) {
  if (dev < 0 || dev >= vndev) return -1;
  vcur = dev;
  protect_all();
  return 0;
}
static int v_device_memory(int dev, size_t *free_bytes, size_t *total_bytes) {
  if (dev < 0 || dev >= vndev) return -1;
  *free_bytes = vfree_bytes[dev];
  *total_bytes = vfree_bytes[dev];
  return 0;
}
static void v_copy_peer(void *dst, int dst_dev, const void *src, int src_dev, size_t bytes) {
  vblock *d = find_block(dst), *s = find_block(src);
  if (!d || !s || d->dev != dst_dev || s->dev != src_dev ||
      (const char *)dst + bytes > d->p + d->len || (const char *)src + bytes > s->p + s->len) {
    vbad_peer++;
    return;
  }
  mprotect(d->p, d->len, PROT_READ | PROT_WRITE);
  mprotect(s->p, s->len, PROT_READ | PROT_WRITE);
  memcpy(dst, src, bytes);
  vhops++;
  protect_all();
}

static void vops_init(int ndev, double free_gib) {
  vops = *ct_ops_cpu();
  vops.name = "cpu-virtual";
  vops.alloc = v_alloc;
  vops.free = v_free;
  vops.device_count = v_device_count;
  vops.set_device = v_set_device;
  vops.device_memory = v_device_memory;
  vops.copy_peer = v_copy_peer;
  vndev = ndev;
  for (int d = 0; d < VMAX; d++) vfree_bytes[d] = (size_t)(free_gib * 1073741824.0);
  vcur = 0;
  protect_all();
}

/* ---- models (tests/unit/tiny_model.h) and engines ---- */

/* An engine's shape: seqs sequence slots of len tokens, rows a prefill forward, layers on map
 * (NULL: one device). */
static ct_infer_cfg engine_cfg(int seqs, int len, int rows, const int *map) {
  ct_infer_cfg ic = CT_INFER_CFG_INIT;
  ic.max_seqs = seqs;
  ic.max_len = len;
  ic.max_rows = rows;
  ic.layer_dev = map;
  return ic;
}

/* What one engine computes: prefill logits of three prompts of different lengths (one at a
 * time and two of equal length together), five batched decode steps' logits and ids, the
 * evaluation loss of two sequences, and a greedy + a sampled ct_generate_infer. */
typedef struct {
  float lg[64 * 20];
  int32_t ids[20];
  double loss;
  long count;
  int32_t gen[3][12];
  int ngen[3];
  int32_t samp[2][8];
  int nsamp[2];
} run_out;

static void run_engine(ct_model *m, const ct_ops *ops, const int *layer_dev, run_out *o) {
  memset(o, 0, sizeof *o);
  const int Vp = ct_model_padded_vocab(ct_model_config(m));
  ct_infer_cfg ic = engine_cfg(3, 40, 24, layer_dev);
  ct_infer *e = NULL;
  ct_status st = ct_infer_create(m, ops, &ic, &e);
  CHECK_MSG(st == CT_OK, "ct_infer_create on %s: %s", ops->name, ct_last_error());
  if (st != CT_OK) return;
  int32_t seq[40];
  for (int i = 0; i < 40; i++) seq[i] = (i * 13 + 7) % 50;
  float *lg = o->lg;
  int at = 0, nid = 0;
  const int s0 = 0, s12[2] = {1, 2};
  CHECK(ct_infer_prefill(e, 1, &s0, seq, 9, lg + at, o->ids + nid++) == CT_OK);
  at += Vp;
  /* two prompts of 5 tokens in one forward: tokens (2, 5) row-major */
  int32_t two[10];
  memcpy(two, seq + 10, sizeof(int32_t) * 5);
  memcpy(two + 5, seq + 20, sizeof(int32_t) * 5);
  CHECK(ct_infer_prefill(e, 2, s12, two, 5, lg + at, o->ids + nid) == CT_OK);
  at += 2 * Vp;
  nid += 2;
  for (int step = 0; step < 5; step++) {
    const int slots[3] = {(step + 1) % 3, step % 3, (step + 2) % 3};
    int32_t tok[3];
    for (int b = 0; b < 3; b++) tok[b] = (step * 5 + slots[b] * 7 + 1) % 50;
    const int nseq = step == 2 ? 2 : 3; /* one step with fewer rows */
    if (at + nseq * Vp > (int)(sizeof o->lg / sizeof o->lg[0])) break;
    CHECK(ct_infer_decode(e, nseq, slots, tok, lg + at, o->ids + nid) == CT_OK);
    at += nseq * Vp;
    nid += nseq;
  }
  ct_infer_destroy(e);

  /* evaluation and generation on a fresh engine with a head of 2 rows at a time */
  ic.logit_rows = 2;
  st = ct_infer_create(m, ops, &ic, &e);
  CHECK_MSG(st == CT_OK, "ct_infer_create (eval) on %s: %s", ops->name, ct_last_error());
  if (st != CT_OK) return;
  int32_t in[16], tg[16];
  for (int i = 0; i < 16; i++) in[i] = seq[i], tg[i] = seq[i + 1];
  tg[3] = -1;
  CHECK_MSG(ct_infer_loss(e, 2, in, tg, 8, &o->loss, &o->count) == CT_OK, "%s", ct_last_error());
  const int32_t *prompts[3] = {seq, seq + 12, seq + 25};
  const int plens[3] = {7, 3, 11};
  int32_t *outs[3] = {o->gen[0], o->gen[1], o->gen[2]};
  ct_sample_cfg s = CT_SAMPLE_INIT;
  s.temperature = 0;
  s.max_new_tokens = 12;
  CHECK_MSG(ct_generate_infer(e, 3, prompts, plens, &s, outs, o->ngen, NULL, NULL, NULL) == CT_OK,
            "%s", ct_last_error());
  s.temperature = 0.8f;
  s.top_k = 10;
  s.max_new_tokens = 8;
  int32_t *souts[2] = {o->samp[0], o->samp[1]};
  CHECK_MSG(ct_generate_infer(e, 2, prompts, plens, &s, souts, o->nsamp, NULL, NULL, NULL) ==
                CT_OK, "%s", ct_last_error());
  ct_infer_destroy(e);
}

static bool same_run(const run_out *a, const run_out *b) {
  return !memcmp(a->lg, b->lg, sizeof a->lg) && !memcmp(a->ids, b->ids, sizeof a->ids) &&
         a->loss == b->loss && a->count == b->count && !memcmp(a->gen, b->gen, sizeof a->gen) &&
         !memcmp(a->ngen, b->ngen, sizeof a->ngen) && !memcmp(a->samp, b->samp, sizeof a->samp) &&
         !memcmp(a->nsamp, b->nsamp, sizeof a->nsamp);
}

/* The engine over 1-4 virtual devices, layers split every way the planner or a user could
 * give, equals the plain CPU engine bit for bit; each device holds memory, hidden states hop
 * (ndev - 1) times a forward, and nothing is left allocated. */
static void test_engine_split(const char *arch) {
  const int L = 4;
  ct_model *m = tiny_model(arch, L, 48, 11);
  static run_out ref, got;
  run_engine(m, ct_ops_cpu(), NULL, &ref);
  CHECK(ref.count == 15);
  CHECK(ref.ngen[0] == 12 && ref.ngen[1] == 12 && ref.ngen[2] == 12);
  static const int maps[][4] = {{0, 0, 0, 0}, {0, 0, 1, 1}, {0, 1, 1, 1}, {0, 0, 0, 1},
                                {0, 1, 2, 3}, {0, 0, 1, 2}, {1, 1, 2, 3}, {2, 2, 2, 2}};
  for (size_t k = 0; k < sizeof maps / sizeof maps[0]; k++) {
    const int *map = maps[k];
    vops_init(4, 80.0);
    vhops = 0;
    vbad_peer = 0;
    run_engine(m, &vops, map, &got);
    int used_devs = 1;
    for (int l = 1; l < L; l++) used_devs += map[l] != map[l - 1];
    CHECK_MSG(same_run(&ref, &got), "%s: layers on devices %d,%d,%d,%d differ from one device",
              arch, map[0], map[1], map[2], map[3]);
    CHECK_MSG(vbad_peer == 0, "%s map %zu: %d hops with a pointer on the wrong device", arch, k,
              vbad_peer);
    CHECK_MSG((vhops > 0) == (used_devs > 1), "%s map %zu: %ld hops over %d devices", arch, k,
              vhops, used_devs);
    for (int d = 0; d < VMAX; d++)
      CHECK_MSG(vused[d] == 0, "%s map %zu: %zu bytes left on device %d after destroy", arch, k,
                vused[d], d);
  }
  /* where the memory goes: with layers {0,0,1,1} each device holds about half the layers'
   * bytes; the untied head (llama) or the tied head's copy (gpt2) lives on device 1 */
  vops_init(2, 80.0);
  const int half[4] = {0, 0, 1, 1};
  ct_infer_cfg ic = engine_cfg(3, 40, 24, half);
  ct_infer *e = NULL;
  CHECK(ct_infer_create(m, &vops, &ic, &e) == CT_OK);
  CHECK_MSG(vused[0] > 0 && vused[1] > 0, "%s: %zu and %zu bytes on devices 0 and 1", arch,
            vused[0], vused[1]);
  char desc[512];
  ct_infer_describe(e, desc, sizeof desc);
  CHECK_MSG(strstr(desc, "cuda:0: layers 0-1 + embedding") && strstr(desc, "cuda:1: layers 2-3 + head"),
            "%s: describe says:\n%s", arch, desc);
  ct_infer_destroy(e);
  ct_model_destroy(m);
}

/* Bad maps are refused with a message: devices out of layer order, more devices than the
 * backend has (the plain CPU table has one), a device the backend cannot switch to. */
static void test_engine_refusals(void) {
  ct_model *m = tiny_model("gpt2", 4, 48, 11);
  ct_infer_cfg ic = engine_cfg(1, 16, 512, NULL);
  ct_infer *e = NULL;
  vops_init(2, 80.0);
  const int back[4] = {0, 1, 1, 0};
  ic.layer_dev = back;
  CHECK(ct_infer_create(m, &vops, &ic, &e) == CT_ERR_USAGE);
  CHECK_MSG(strstr(ct_last_error(), "layer 3 on device 0 after device 1"), "%s", ct_last_error());
  const int two[4] = {0, 0, 1, 1};
  ic.layer_dev = two;
  CHECK(ct_infer_create(m, ct_ops_cpu(), &ic, &e) == CT_ERR_USAGE);
  CHECK_MSG(strstr(ct_last_error(), "backend cpu has one device"), "%s", ct_last_error());
  const int far[4] = {0, 0, 3, 3};
  ic.layer_dev = far;
  CHECK(ct_infer_create(m, &vops, &ic, &e) == CT_ERR_RUNTIME);
  CHECK_MSG(strstr(ct_last_error(), "cannot use device 3"), "%s", ct_last_error());
  for (int d = 0; d < VMAX; d++) CHECK_MSG(vused[d] == 0, "%zu bytes left on device %d", vused[d], d);
  ct_model_destroy(m);
}

/* ---- the planner ---- */

/* The shape every plan here is made for, and the engines that check a plan are built with. */
enum { PLAN_SEQS = 2, PLAN_LEN = 32, PLAN_ROWS = 64 };
static int plan(const ct_model *m, const char *spec, const char *maxmem, int *dev, char *rep) {
  return ct_infer_plan(m, &vops, spec, maxmem, PLAN_SEQS, PLAN_LEN, PLAN_ROWS, dev, rep, 1024);
}

static bool map_is(const int *dev, int L, const char *want) {
  for (int l = 0; l < L; l++)
    if (dev[l] != want[l] - '0') return false;
  return true;
}

static void map_str(const int *dev, int L, char *out) {
  for (int l = 0; l < L; l++) out[l] = (char)('0' + dev[l]);
  out[L] = 0;
}

#define CHECK_MAP(spec, maxmem, want)                                                          \
  do {                                                                                          \
    const char *mm_ = maxmem;                                                                   \
    int st_ = plan(m, spec, mm_, dev, rep);                                                     \
    map_str(dev, L, s);                                                                         \
    CHECK_MSG(st_ == CT_OK && map_is(dev, L, want), "%s / %s: %s, map %s, want %s", spec,        \
              mm_ ? mm_ : "-", st_ == CT_OK ? rep : ct_last_error(), s, want);                  \
  } while (0)

static void test_plan(void) {
  const int L = 8;
  ct_model *m = tiny_model("llama", L, 48, 11);
  int dev[8];
  char rep[1024], s[16];
  /* plenty of memory on 3 devices */
  vops_init(3, 80.0);
  CHECK_MAP("auto", NULL, "00000000");
  CHECK_MSG(strstr(rep, "device_map auto (one device): cuda:0 layers 0-7"), "%s", rep);
  CHECK_MAP("balanced", NULL, "00011122");
  CHECK_MSG(strstr(rep, "cuda:0 layers 0-2 (") && strstr(rep, "cuda:1 layers 3-5 (") &&
                strstr(rep, "cuda:2 layers 6-7 ("), "%s", rep);
  CHECK_MAP("sequential", NULL, "00000000");
  CHECK_MAP("cuda:2", NULL, "22222222");
  CHECK_MAP("1", NULL, "11111111");
  /* --max_memory: nothing on device 0 moves everything to 1; a small budget on 0 makes auto
   * balance */
  CHECK_MAP("sequential", "0=1MiB", "11111111");
  CHECK_MSG(strstr(rep, "device_map sequential: cuda:1 layers 0-7"), "%s", rep);
  CHECK_MAP("sequential", "0=0,1=1KiB", "22222222");
  /* the planner's per-layer cost: find the budget at which device 0 holds exactly k layers
   * (sequential fills in order), and check each extra layer moves the split by one */
  {
    int st = plan(m, "sequential", "0=1GiB,1=1GiB,2=1GiB", dev, rep);
    CHECK(st == CT_OK && map_is(dev, L, "00000000"));
    /* a budget between "k layers" and "k + 1 layers": bisect the byte count for k = 3 */
    long long lo = 0, hi = 1LL << 30;
    while (hi - lo > 1) {
      const long long mid = lo + (hi - lo) / 2;
      char mm[64];
      snprintf(mm, sizeof mm, "0=%lld", mid);
      if (plan(m, "sequential", mm, dev, rep) == CT_OK && dev[3] == 0) hi = mid;
      else lo = mid;
    }
    char mm[64];
    snprintf(mm, sizeof mm, "0=%lld", hi);
    CHECK_MAP("sequential", mm, "00001111");
    snprintf(mm, sizeof mm, "0=%lld", lo);
    CHECK_MAP("sequential", mm, "00011111");
  }
  /* auto falls back to balanced when device 0 cannot hold the model, and to sequential when
   * balanced does not fit either (device 1 smaller than its share) */
  {
    /* budgets from the fit of the whole model on one device */
    long long whole_lo = 0, whole_hi = 1LL << 30;
    while (whole_hi - whole_lo > 1) {
      const long long mid = whole_lo + (whole_hi - whole_lo) / 2;
      char mm[64];
      snprintf(mm, sizeof mm, "0=%lld", mid);
      if (plan(m, "cuda:0", mm, dev, rep) == CT_OK) whole_hi = mid;
      else whole_lo = mid;
    }
    char mm[128];
    snprintf(mm, sizeof mm, "0=%lld,1=%lld,2=%lld", whole_lo, whole_hi, whole_hi);
    CHECK_MAP("auto", mm, "00011122");
    CHECK_MSG(strstr(rep, "device_map auto (balanced)"), "%s", rep);
    /* device 1 with room for no layer: balanced fails, sequential skips it */
    snprintf(mm, sizeof mm, "0=%lld,1=0,2=%lld", whole_lo, whole_hi);
    int st = plan(m, "auto", mm, dev, rep);
    map_str(dev, L, s);
    CHECK_MSG(st == CT_OK && strstr(rep, "device_map auto (sequential)") && dev[0] == 0 &&
                  dev[L - 1] == 2, "auto with no room on 1: %s, map %s",
              st == CT_OK ? rep : ct_last_error(), s);
    for (int l = 0; st == CT_OK && l < L; l++) CHECK_MSG(dev[l] != 1, "layer %d on device 1", l);
    /* the estimate against what the engine allocates with every layer on device 0: the plan
     * keeps 256 MiB for library workspaces beyond the engine's own buffers, which it must
     * cover (each block rounded to pages here) without overstating them twice over */
    {
      vops_init(3, 80.0);
      const int all0[8] = {0};
      ct_infer_cfg ic = engine_cfg(PLAN_SEQS, PLAN_LEN, PLAN_ROWS, all0);
      ct_infer *e = NULL;
      CHECK_MSG(ct_infer_create(m, &vops, &ic, &e) == CT_OK, "%s", ct_last_error());
      const double own = (double)whole_hi - 256.0 * 1048576.0;
      const double slack = (double)nblocks * (double)sysconf(_SC_PAGESIZE);
      printf("plan for one device: %.0f bytes besides the workspace; the engine allocated %zu in"
             " %d blocks\n", own, vused[0], nblocks);
      CHECK_MSG(vused[0] <= own + slack && vused[0] >= 0.5 * own,
                "engine allocated %zu bytes on device 0, the plan counts %.0f (+%.0f of pages)",
                vused[0], own, slack);
      ct_infer_destroy(e);
    }
    /* cuda:0 alone, just short: fails naming the device and the budget's origin */
    snprintf(mm, sizeof mm, "0=%lld", whole_lo);
    CHECK(plan(m, "cuda:0", mm, dev, rep) == CT_ERR_RUNTIME);
    CHECK_MSG(strstr(ct_last_error(), "does not fit: cuda:0 needs") &&
                  strstr(ct_last_error(), "(--max_memory)"), "%s", ct_last_error());
  }
  /* nothing fits anywhere: the free-memory budget is named */
  vops_init(2, 1e-6);
  CHECK(plan(m, "auto", NULL, dev, rep) == CT_ERR_RUNTIME);
  CHECK_MSG(strstr(ct_last_error(), "does not fit") && strstr(ct_last_error(), "90% of its free"),
            "%s", ct_last_error());
  /* bad specs */
  vops_init(2, 80.0);
  static const struct { const char *spec, *mm, *msg; } bad[] = {
      {"fast", NULL, "--device_map fast: expected auto, balanced, sequential or cuda:N"},
      {"cuda:", NULL, "expected auto, balanced"},
      {"cuda:-1", NULL, "expected auto, balanced"},
      {"cuda:2", NULL, "only 2 CUDA device(s) visible"},
      {"auto", "0=lots", "--max_memory 0=lots: expected DEVICE=SIZE"},
      {"auto", "0=20XB", "expected DEVICE=SIZE"},
      {"auto", "20GiB", "expected DEVICE=SIZE"},
      {"auto", "x=1GiB", "expected DEVICE=SIZE"},
      {"auto", "5=1GiB", "device 5 is not visible (2 device(s))"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CHECK_MSG(plan(m, bad[i].spec, bad[i].mm, dev, rep) == CT_ERR_USAGE, "%s / %s accepted",
              bad[i].spec, bad[i].mm ? bad[i].mm : "-");
    CHECK_MSG(strstr(ct_last_error(), bad[i].msg), "%s / %s: %s (want \"%s\")", bad[i].spec,
              bad[i].mm ? bad[i].mm : "-", ct_last_error(), bad[i].msg);
  }
  /* no devices at all (the plain CPU table) */
  CHECK(ct_infer_plan(m, ct_ops_cpu(), "auto", NULL, 1, 16, 16, dev, rep, sizeof rep) ==
        CT_ERR_USAGE);
  CHECK_MSG(strstr(ct_last_error(), "no CUDA device is visible (backend cpu)"), "%s",
            ct_last_error());
  /* ... but a misspelt budget is named as one first, and the spelling alone checks out without
   * any device (ct_device_map_check, what the CPU commands ask before saying a GPU is needed) */
  CHECK(ct_infer_plan(m, ct_ops_cpu(), "auto", "0=2XB", 1, 16, 16, dev, rep, sizeof rep) ==
        CT_ERR_USAGE);
  CHECK_MSG(strstr(ct_last_error(), "--max_memory 0=2XB: expected DEVICE=SIZE"), "%s",
            ct_last_error());
  CHECK(ct_device_map_check("cuda:3", "0=1GiB,3=2.5TB") == CT_OK);
  CHECK(ct_device_map_check(NULL, NULL) == CT_OK);
  CHECK(ct_device_map_check("cuda:x", NULL) == CT_ERR_USAGE);
  CHECK(ct_device_map_check("balanced", "0=1GiB,") == CT_OK);
  CHECK(ct_device_map_check("balanced", "0=") == CT_ERR_USAGE);
  ct_model_destroy(m);
}

/* A planned map runs, and the plan's estimate per device covers what the engine allocated
 * there (the tied head's copy included for gpt2). */
static void test_plan_runs(const char *arch) {
  const int L = 8;
  ct_model *m = tiny_model(arch, L, 48, 11);
  int dev[8];
  char rep[1024];
  vops_init(3, 80.0);
  CHECK(plan(m, "balanced", NULL, dev, rep) == CT_OK);
  ct_infer_cfg ic = engine_cfg(PLAN_SEQS, PLAN_LEN, PLAN_ROWS, dev);
  ct_infer *e = NULL;
  CHECK_MSG(ct_infer_create(m, &vops, &ic, &e) == CT_OK, "%s", ct_last_error());
  if (e) {
    for (int d = 0; d < 3; d++) {
      char key[32];
      snprintf(key, sizeof key, "cuda:%d layers", d);
      const char *at = strstr(rep, key);
      double need = 0, budget = 0;
      CHECK_MSG(at && sscanf(strchr(at, '(') + 1, "%lf of %lf", &need, &budget) == 2, "%s", rep);
      CHECK_MSG(vused[d] > 0 && vused[d] <= need * 1073741824.0 + 0.01 * 1073741824.0,
                "%s device %d: %zu bytes allocated, plan said %.2f GiB", arch, d, vused[d], need);
    }
    ct_infer_destroy(e);
  }
  ct_model_destroy(m);
}

int main(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &sa, NULL);
  test_plan();
  test_plan_runs("llama");
  test_plan_runs("gpt2");
  test_engine_refusals();
  test_engine_split("gpt2");
  test_engine_split("llama");
  return ct_test_finish();
}

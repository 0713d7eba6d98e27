/* bench/comm_bench.c — collective bandwidth of ctrain's comm layer (parallel/comm.h), printed
 * like nccl-tests: for each size, the time per call averaged over ranks after warm-up, algbw =
 * bytes / time, busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for reduce-scatter and
 * all-gather (bytes = the whole buffer: all-reduce's buffer, reduce-scatter's send, all-gather's
 * receive).
 *
 *   RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 comm_bench [opts] &
 *   RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 comm_bench [opts]
 *   (or mpirun / srun: the environment contract of parallel/env.h)
 * Options: --backend nccl|gloo (default: nccl when the build has it and a GPU is visible),
 *          --min_bytes B --max_bytes B (powers of two between; default 1 MiB .. 256 MiB),
 *          --iters N (default 20), --warmup N (default 5), --dtype f32|bf16 (default f32).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ct_build_config.h"
#include "common/log.h"
#include "common/status.h"
#include "common/util.h"
#include "parallel/comm.h"
#include "parallel/env.h"
#if CT_HAVE_CUDA
#include "kernels/cuda/ops_cuda.h"
#endif
#if CT_HAVE_NCCL
#include <nccl.h>
#endif

typedef enum { AR, RS, AG } coll;
static const char *coll_name[] = {"all_reduce", "reduce_scatter", "all_gather"};

static ct_status run(ct_comm *c, coll k, void *buf, void *out, size_t count, ct_dtype dt) {
  const int n = ct_comm_size(c), r = ct_comm_rank(c);
  const size_t per = count / (size_t)n, es = ct_dtype_size(dt);
  switch (k) {
    case AR: return ct_comm_all_reduce(c, buf, count, dt, CT_SUM);
    case RS: return ct_comm_reduce_scatter(c, buf, out, per, dt, CT_SUM);
    default: return ct_comm_all_gather(c, (char *)buf + (size_t)r * per * es, out, per, dt);
  }
}

int main(int argc, char **argv) {
  size_t min_b = (size_t)1 << 20, max_b = (size_t)256 << 20;
  int iters = 20, warm = 5;
  const char *backend = NULL;
  ct_dtype dt = CT_F32;
  for (int i = 1; i < argc; i++) {
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(argv[i], "--min_bytes") && v) min_b = strtoull(v, NULL, 10), i++;
    else if (!strcmp(argv[i], "--max_bytes") && v) max_b = strtoull(v, NULL, 10), i++;
    else if (!strcmp(argv[i], "--iters") && v) iters = atoi(v), i++;
    else if (!strcmp(argv[i], "--warmup") && v) warm = atoi(v), i++;
    else if (!strcmp(argv[i], "--backend") && v) backend = v, i++;
    else if (!strcmp(argv[i], "--dtype") && v) dt = !strcmp(v, "bf16") ? CT_BF16 : CT_F32, i++;
    else {
      fprintf(stderr, "comm_bench: unknown argument %s (see the header of bench/comm_bench.c)\n", argv[i]);
      return 2;
    }
  }
  ct_dist_env env;
  ct_store_server *server = NULL;
  ct_store *store = NULL;
  ct_comm *c = NULL;
  ct_status st = ct_dist_env_detect(&env);
  bool nccl = false;
#if CT_HAVE_CUDA && CT_HAVE_NCCL
  char err[256];
  nccl = !backend || !strcmp(backend, "nccl");
  if (nccl && ct_cuda_init(env.local_rank, err, sizeof err) != 0) {
    if (backend) {
      fprintf(stderr, "comm_bench: rank %d: %s\n", env.rank, err);
      return 1;
    }
    nccl = false; /* no GPU: Gloo */
  }
#endif
  if (backend && !strcmp(backend, "nccl") && !nccl) {
    fprintf(stderr, "comm_bench: this build has no NCCL\n");
    return 2;
  }
  if (st == CT_OK) st = ct_dist_store_open(&env, 120, &server, &store);
  if (st == CT_OK)
    st = nccl ? ct_comm_init_nccl(store, env.rank, env.world_size, "bench", 120, &c)
              : ct_comm_init_gloo(store, env.rank, env.world_size, "bench", 120, &c);
  if (st != CT_OK) {
    fprintf(stderr, "comm_bench: rank %d: %s\n", env.rank, ct_last_error());
    return 1;
  }
  const int n = env.world_size;
  const size_t es = ct_dtype_size(dt);
  void *buf = NULL, *out = NULL;
  double *t = NULL;
#if CT_HAVE_CUDA
  const void *ops = nccl ? (const void *)ct_ops_cuda() : NULL;
#endif
  /* buffers of max_b (rounded to n elements) */
  const size_t cap = (max_b / es / (size_t)n) * (size_t)n * es;
  /* CT_COMM_REGISTER=1: the buffers registered with the communicator (ct_comm_register); 2:
   * also allocated by NCCL (ncclMemAlloc, which registration is documented for) */
  const char *rg = getenv("CT_COMM_REGISTER");
  const int reg = nccl && rg ? atoi(rg) : 0;
#if CT_HAVE_CUDA
  if (ops) {
#if CT_HAVE_NCCL
    if (reg == 2) {
      if (ncclMemAlloc(&buf, cap) != ncclSuccess || ncclMemAlloc(&out, cap) != ncclSuccess)
        buf = out = NULL;
    } else
#endif
    {
      buf = ct_ops_cuda()->alloc(cap);
      out = ct_ops_cuda()->alloc(cap);
    }
  } else
#endif
  {
    buf = calloc(1, cap);
    out = calloc(1, cap);
  }
  t = ct_calloc(1, sizeof(double), "time");
  if (!buf || !out || !t) {
    fprintf(stderr, "comm_bench: rank %d: out of memory for 2 x %zu bytes\n", env.rank, cap);
    return 1;
  }
  if (reg) {
    st = ct_comm_register(c, buf, cap);
    if (st == CT_OK) st = ct_comm_register(c, out, cap);
  }
  if (env.rank == 0)
    printf("# ctrain comm layer: %s, %d ranks, %s, %d iterations after %d warm-up%s\n"
           "# %-15s %12s %12s %10s %10s %10s\n", ct_comm_backend(c), n, ct_dtype_name(dt), iters,
           warm, reg == 2 ? ", buffers from ncclMemAlloc, registered" : reg ? ", buffers registered" : "",
           "collective", "bytes", "elements", "time_us", "algbw_GB/s", "busbw_GB/s");
  for (int k = AR; k <= AG && st == CT_OK; k++)
    for (size_t bytes = min_b; bytes <= max_b && st == CT_OK; bytes *= 2) {
      const size_t count = bytes / es / (size_t)n * (size_t)n;
      if (!count) continue;
      for (int i = 0; i < warm && st == CT_OK; i++) st = run(c, (coll)k, buf, out, count, dt);
      if (st == CT_OK) st = ct_comm_barrier(c);
      const double t0 = ct_now();
      for (int i = 0; i < iters && st == CT_OK; i++) st = run(c, (coll)k, buf, out, count, dt);
      if (st == CT_OK) st = ct_comm_sync(c);
      float mine = (float)((ct_now() - t0) / iters), *tv = &mine;
      /* average the per-call time over ranks (a one-float all-reduce on the group) */
#if CT_HAVE_CUDA
      if (ops) {
        float *dev = out; /* reuse the output buffer's first float */
        ct_ops_cuda()->to_device(dev, &mine, sizeof mine);
        if (st == CT_OK) st = ct_comm_all_reduce(c, dev, 1, CT_F32, CT_AVG);
        if (st == CT_OK) st = ct_comm_sync(c);
        if (st == CT_OK) ct_ops_cuda()->to_host(&mine, dev, sizeof mine);
      } else
#endif
        if (st == CT_OK) st = ct_comm_all_reduce(c, tv, 1, CT_F32, CT_AVG);
      const double sec = mine, b = (double)(count * es), alg = b / sec / 1e9;
      const double bus = alg * (k == AR ? 2.0 * (n - 1) / n : (double)(n - 1) / n);
      if (st == CT_OK && env.rank == 0)
        printf("  %-15s %12.0f %12zu %10.1f %10.2f %10.2f\n", coll_name[k], b, count, sec * 1e6,
               alg, bus);
      fflush(stdout);
    }
  if (st != CT_OK) fprintf(stderr, "comm_bench: rank %d: %s\n", env.rank, ct_last_error());
  if (st == CT_OK) ct_comm_barrier(c);
  ct_comm_destroy(c);
  ct_store_close(store);
  ct_store_server_stop_when_idle(server, 30);
#if CT_HAVE_CUDA
  if (ops) {
#if CT_HAVE_NCCL
    if (reg == 2) {
      ncclMemFree(buf);
      ncclMemFree(out);
    } else
#endif
    {
      ct_ops_cuda()->free(buf);
      ct_ops_cuda()->free(out);
    }
    ct_cuda_shutdown();
  } else
#endif
  {
    free(buf);
    free(out);
  }
  free(t);
  return st == CT_OK ? 0 : 1;
}

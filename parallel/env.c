/* parallel/env.c — distributed environment detection (see parallel/env.h). */
#define _GNU_SOURCE
#include "parallel/env.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

/* ------------------------------------------------------------------ helpers */

/* Reads integer variable `name`. Absent: *out = dflt, CT_OK. Present but not an integer in
 * [lo, hi]: CT_ERR_USAGE naming the variable and its value. */
static ct_status env_int(const char *name, int dflt, int lo, int hi, int *out) {
  const char *v = getenv(name);
  if (!v || !v[0]) { *out = dflt; return CT_OK; }
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  while (*end && isspace((unsigned char)*end)) end++;
  if (errno || *end || x < lo || x > hi)
    return ct_set_error(CT_ERR_USAGE, "environment: %s=\"%s\" is not an integer in %d..%d", name, v, lo, hi);
  *out = (int)x;
  return CT_OK;
}

static const char *env_first(const char *const *names) {
  for (; *names; names++) {
    const char *v = getenv(*names);
    if (v && v[0]) return v;
  }
  return NULL;
}

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

/* A token derived from the job id, the same on every rank of the job. It is not a secret:
 * under srun / mpirun there is no launcher to hand out a random one, and such jobs are already
 * trusted by the scheduler; the token still keeps a run from talking to another run's store. */
static void derive_token(const char *seed, char *out, size_t cap) {
  uint64_t a = ct_mix64(hash_str(seed)), b = ct_mix64(a ^ 0x5851F42D4C957F2Dull);
  snprintf(out, cap, "%016" PRIx64 "%016" PRIx64, a, b);
}

static bool is_loopback(const char *host) {
  return !strcmp(host, "127.0.0.1") || !strcmp(host, "localhost") || !strcmp(host, "::1");
}

/* ------------------------------------------------------------------ Slurm host lists */

typedef struct strlist {
  char **v;
  int n, cap;
} strlist;

static bool sl_push(strlist *l, char *s) {
  if (!s) return false;
  if (l->n == l->cap) {
    int cap = l->cap ? l->cap * 2 : 8;
    char **v = realloc(l->v, (size_t)cap * sizeof *v);
    if (!v) { free(s); return false; }
    l->v = v;
    l->cap = cap;
  }
  l->v[l->n++] = s;
  return true;
}

static void sl_free(strlist *l) {
  for (int i = 0; i < l->n; i++) free(l->v[i]);
  free(l->v);
  memset(l, 0, sizeof *l);
}

static char *str_cat(const char *a, const char *b, size_t blen) {
  size_t alen = strlen(a);
  char *s = malloc(alen + blen + 1);
  if (!s) return NULL;
  memcpy(s, a, alen);
  memcpy(s + alen, b, blen);
  s[alen + blen] = '\0';
  return s;
}

#define NODELIST_MAX 1000000 /* names in one expansion: guards against "n[0-999999999]" */

/* Expands one host expression ("rack[1-2]-gpu[01-03]"): literal text and bracket groups,
 * the result is their cartesian product in order. */
static ct_status expand_one(const char *list, const char *p, const char *end, strlist *out) {
  strlist cur = {0};
  ct_status st = CT_OK;
  if (!sl_push(&cur, ct_strdup(""))) goto nomem;
  while (p < end) {
    if (*p == '[') {
      const char *close = memchr(p, ']', (size_t)(end - p));
      if (!close) { st = ct_set_error(CT_ERR_INPUT, "Slurm node list \"%s\": '[' without ']'", list); goto fail; }
      /* the group: comma-separated numbers or ranges lo-hi (width of lo kept: 01-04) */
      strlist suffixes = {0};
      const char *q = p + 1;
      while (q < close) {
        const char *comma = memchr(q, ',', (size_t)(close - q));
        if (!comma) comma = close;
        const char *dash = memchr(q, '-', (size_t)(comma - q));
        const char *lo_end = dash ? dash : comma;
        bool ok = lo_end > q;
        for (const char *c = q; c < comma; c++)
          if (c != dash && !isdigit((unsigned char)*c)) ok = false;
        if (dash && dash + 1 >= comma) ok = false;
        if (!ok) {
          sl_free(&suffixes);
          st = ct_set_error(CT_ERR_INPUT, "Slurm node list \"%s\": bad range \"%.*s\" (want N or LO-HI)", list,
                            (int)(comma - q), q);
          goto fail;
        }
        int width = (int)(lo_end - q);
        long lo = strtol(q, NULL, 10), hi = dash ? strtol(dash + 1, NULL, 10) : lo;
        if (hi < lo || (hi - lo) >= NODELIST_MAX || (long)cur.n * (hi - lo + 1) + suffixes.n > NODELIST_MAX) {
          sl_free(&suffixes);
          st = ct_set_error(CT_ERR_INPUT, "Slurm node list \"%s\": range \"%.*s\" is empty or too large", list,
                            (int)(comma - q), q);
          goto fail;
        }
        for (long x = lo; x <= hi; x++) {
          char num[32];
          snprintf(num, sizeof num, "%0*ld", width, x);
          if (!sl_push(&suffixes, ct_strdup(num))) { sl_free(&suffixes); goto nomem; }
        }
        q = comma + 1;
      }
      if (suffixes.n == 0) {
        st = ct_set_error(CT_ERR_INPUT, "Slurm node list \"%s\": empty brackets", list);
        goto fail;
      }
      strlist next = {0};
      for (int i = 0; i < cur.n; i++)
        for (int j = 0; j < suffixes.n; j++)
          if (!sl_push(&next, str_cat(cur.v[i], suffixes.v[j], strlen(suffixes.v[j])))) {
            sl_free(&next);
            sl_free(&suffixes);
            goto nomem;
          }
      sl_free(&suffixes);
      sl_free(&cur);
      cur = next;
      p = close + 1;
    } else if (*p == ']') {
      st = ct_set_error(CT_ERR_INPUT, "Slurm node list \"%s\": ']' without '['", list);
      goto fail;
    } else {
      const char *lit = p;
      while (p < end && *p != '[' && *p != ']') p++;
      for (int i = 0; i < cur.n; i++) {
        char *s = str_cat(cur.v[i], lit, (size_t)(p - lit));
        if (!s) goto nomem;
        free(cur.v[i]);
        cur.v[i] = s;
      }
    }
  }
  for (int i = 0; i < cur.n; i++) {
    if (!sl_push(out, cur.v[i])) { cur.v[i] = NULL; goto nomem; }
    cur.v[i] = NULL;
  }
  sl_free(&cur);
  return CT_OK;
nomem:
  st = ct_set_error(CT_ERR_NOMEM, "Slurm node list \"%s\": out of memory", list);
fail:
  sl_free(&cur);
  return st;
}

ct_status ct_slurm_expand_nodelist(const char *list, char ***names, int *n) {
  *names = NULL;
  *n = 0;
  if (!list) return ct_set_error(CT_ERR_INPUT, "Slurm node list: missing");
  strlist out = {0};
  const char *p = list;
  while (*p) {
    /* split at commas outside brackets */
    const char *q = p;
    int depth = 0;
    while (*q && !(*q == ',' && depth == 0)) {
      if (*q == '[') depth++;
      if (*q == ']') depth--;
      q++;
    }
    if (q == p) {
      sl_free(&out);
      return ct_set_error(CT_ERR_INPUT, "Slurm node list \"%s\": empty host name", list);
    }
    ct_status st = expand_one(list, p, q, &out);
    if (st) { sl_free(&out); return st; }
    if (out.n > NODELIST_MAX) { sl_free(&out); return ct_set_error(CT_ERR_INPUT, "Slurm node list \"%s\": too many hosts", list); }
    p = *q ? q + 1 : q;
    if (*q == ',' && !*p) {
      sl_free(&out);
      return ct_set_error(CT_ERR_INPUT, "Slurm node list \"%s\": trailing comma", list);
    }
  }
  if (out.n == 0) return ct_set_error(CT_ERR_INPUT, "Slurm node list \"%s\": no hosts", list);
  *names = out.v;
  *n = out.n;
  return CT_OK;
}

/* Tasks on node `node` from SLURM_STEP_TASKS_PER_NODE-style text: "2(x3),1" = 2,2,2,1.
 * Returns 0 when the text does not parse or has no such node. */
static int slurm_tasks_on_node(const char *spec, int node) {
  if (!spec) return 0;
  int seen = 0;
  const char *p = spec;
  while (*p) {
    char *end;
    long count = strtol(p, &end, 10), rep = 1;
    if (end == p || count <= 0) return 0;
    p = end;
    if (*p == '(') {
      if (p[1] != 'x') return 0;
      rep = strtol(p + 2, &end, 10);
      if (end == p + 2 || *end != ')' || rep <= 0) return 0;
      p = end + 1;
    }
    if (node < seen + rep) return (int)count;
    seen += (int)rep;
    if (*p == ',') p++;
    else if (*p) return 0;
  }
  return 0;
}

/* ------------------------------------------------------------------ detection */

static ct_status detect_launcher(ct_dist_env *e) {
  CT_TRY(env_int("WORLD_SIZE", 1, 1, INT_MAX, &e->world_size));
  CT_TRY(env_int("RANK", 0, 0, e->world_size - 1, &e->rank));
  /* Set by hand, only RANK and WORLD_SIZE may be there: assume one node. */
  CT_TRY(env_int("LOCAL_WORLD_SIZE", e->world_size, 1, e->world_size, &e->local_world_size));
  CT_TRY(env_int("LOCAL_RANK", e->rank % e->local_world_size, 0, e->local_world_size - 1, &e->local_rank));
  e->nnodes = (e->world_size + e->local_world_size - 1) / e->local_world_size;
  CT_TRY(env_int("GROUP_RANK", e->rank / e->local_world_size, 0, e->nnodes - 1, &e->node_rank));
  const char *addr = getenv("MASTER_ADDR");
  snprintf(e->master_addr, sizeof e->master_addr, "%s", addr && addr[0] ? addr : "127.0.0.1");
  CT_TRY(env_int("MASTER_PORT", CT_DIST_DEFAULT_PORT, 1, 65535, &e->master_port));
  static const char *const restarts[] = {"CTRAIN_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT", NULL};
  const char *rc_name = getenv(restarts[0]) ? restarts[0] : restarts[1];
  CT_TRY(env_int(rc_name, 0, 0, INT_MAX, &e->restart_count));
  static const char *const ids[] = {"CTRAIN_RUN_ID", "TORCHELASTIC_RUN_ID", NULL};
  const char *id = env_first(ids);
  snprintf(e->run_id, sizeof e->run_id, "%s", id ? id : "local");
  const char *tok = getenv("CTRAIN_STORE_TOKEN");
  if (tok && tok[0]) {
    snprintf(e->store_token, sizeof e->store_token, "%s", tok);
  } else {
    /* Variables set by hand (or by torchrun, whose store speaks another protocol): nobody
     * hosts a ctrain store, so rank 0 does, on MASTER_PORT. */
    char seed[400];
    snprintf(seed, sizeof seed, "manual:%s:%d:%d", e->master_addr, e->master_port, e->world_size);
    derive_token(seed, e->store_token, sizeof e->store_token);
    e->rank0_hosts_store = true;
  }
  e->source = "launcher";
  return CT_OK;
}

static ct_status detect_openmpi(ct_dist_env *e) {
  CT_TRY(env_int("OMPI_COMM_WORLD_SIZE", 1, 1, INT_MAX, &e->world_size));
  CT_TRY(env_int("OMPI_COMM_WORLD_RANK", 0, 0, e->world_size - 1, &e->rank));
  CT_TRY(env_int("OMPI_COMM_WORLD_LOCAL_SIZE", e->world_size, 1, e->world_size, &e->local_world_size));
  CT_TRY(env_int("OMPI_COMM_WORLD_LOCAL_RANK", e->rank % e->local_world_size, 0, e->local_world_size - 1,
                 &e->local_rank));
  e->nnodes = (e->world_size + e->local_world_size - 1) / e->local_world_size;
  CT_TRY(env_int("OMPI_COMM_WORLD_NODE_RANK", e->rank / e->local_world_size, 0, INT_MAX, &e->node_rank));
  /* Open MPI 4 exports the job id as OMPI_MCA_ess_base_jobid, Open MPI 5 (PMIx) a namespace. */
  static const char *const jobs[] = {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "OMPI_MCA_orte_hnp_uri", NULL};
  const char *job = env_first(jobs);
  if (!job) job = "openmpi";
  char seed[512];
  snprintf(seed, sizeof seed, "openmpi:%s", job);
  derive_token(seed, e->store_token, sizeof e->store_token);
  snprintf(e->run_id, sizeof e->run_id, "ompi-%016" PRIx64, hash_str(job));
  CT_TRY(env_int("MASTER_PORT", CT_DIST_DEFAULT_PORT + (int)(hash_str(job) % 1000), 1, 65535, &e->master_port));
  const char *addr = getenv("MASTER_ADDR");
  if (addr && addr[0]) {
    snprintf(e->master_addr, sizeof e->master_addr, "%s", addr);
  } else if (e->nnodes == 1) {
    snprintf(e->master_addr, sizeof e->master_addr, "127.0.0.1");
  } else {
    /* Open MPI does not tell a process where rank 0 runs. */
    return ct_set_error(CT_ERR_USAGE, "environment: mpirun across %d nodes: set MASTER_ADDR to rank 0's host "
                        "(mpirun -x MASTER_ADDR=host ...)", e->nnodes);
  }
  e->rank0_hosts_store = true;
  e->source = "openmpi";
  return CT_OK;
}

static ct_status detect_slurm(ct_dist_env *e) {
  static const char *const ntasks[] = {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS", NULL};
  const char *nt = env_first(ntasks);
  if (!nt) return ct_set_error(CT_ERR_USAGE, "environment: SLURM_PROCID is set but SLURM_NTASKS is not "
                               "(start the workers with srun)");
  const char *nt_name = getenv("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS"
                        : getenv("SLURM_NTASKS") ? "SLURM_NTASKS" : "SLURM_NPROCS";
  CT_TRY(env_int(nt_name, 1, 1, INT_MAX, &e->world_size));
  CT_TRY(env_int("SLURM_PROCID", 0, 0, e->world_size - 1, &e->rank));
  const char *nn_name = getenv("SLURM_STEP_NUM_NODES") ? "SLURM_STEP_NUM_NODES"
                        : getenv("SLURM_NNODES") ? "SLURM_NNODES" : "SLURM_JOB_NUM_NODES";
  CT_TRY(env_int(nn_name, 1, 1, e->world_size, &e->nnodes));
  CT_TRY(env_int("SLURM_NODEID", 0, 0, e->nnodes - 1, &e->node_rank));
  CT_TRY(env_int("SLURM_LOCALID", 0, 0, INT_MAX, &e->local_rank));
  static const char *const tpn[] = {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", NULL};
  int local = slurm_tasks_on_node(env_first(tpn), e->node_rank);
  if (local <= 0) CT_TRY(env_int("SLURM_NTASKS_PER_NODE", (e->world_size + e->nnodes - 1) / e->nnodes, 1,
                                 INT_MAX, &local));
  e->local_world_size = local;
  if (e->local_rank >= e->local_world_size)
    return ct_set_error(CT_ERR_USAGE, "environment: SLURM_LOCALID=%d but only %d task(s) on this node",
                        e->local_rank, e->local_world_size);
  const char *job = getenv("SLURM_JOB_ID");
  if (!job || !job[0]) job = getenv("SLURM_JOBID");
  if (!job || !job[0]) job = "0";
  const char *step = getenv("SLURM_STEP_ID");
  char seed[256];
  snprintf(seed, sizeof seed, "slurm:%s.%s", job, step ? step : "");
  derive_token(seed, e->store_token, sizeof e->store_token);
  snprintf(e->run_id, sizeof e->run_id, "slurm-%s", job);
  char *jend;
  unsigned long long jobnum = strtoull(job, &jend, 10);
  int dflt_port = CT_DIST_DEFAULT_PORT + (int)((*jend ? hash_str(job) : jobnum) % 1000);
  CT_TRY(env_int("MASTER_PORT", dflt_port, 1, 65535, &e->master_port));
  const char *addr = getenv("MASTER_ADDR");
  if (addr && addr[0]) {
    snprintf(e->master_addr, sizeof e->master_addr, "%s", addr);
  } else {
    /* Rank 0 of a step runs on the first node of the step, so prefer the step's list. */
    static const char *const lists[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST", NULL};
    const char *list = env_first(lists);
    if (!list) {
      if (e->nnodes > 1)
        return ct_set_error(CT_ERR_USAGE, "environment: Slurm across %d nodes but SLURM_JOB_NODELIST is unset; "
                            "set MASTER_ADDR", e->nnodes);
      snprintf(e->master_addr, sizeof e->master_addr, "127.0.0.1");
    } else {
      char **names;
      int n;
      CT_TRY(ct_slurm_expand_nodelist(list, &names, &n));
      snprintf(e->master_addr, sizeof e->master_addr, "%s", names[0]);
      for (int i = 0; i < n; i++) free(names[i]);
      free(names);
    }
  }
  e->rank0_hosts_store = true;
  e->source = "slurm";
  return CT_OK;
}

ct_status ct_dist_env_detect(ct_dist_env *e) {
  memset(e, 0, sizeof *e);
  e->world_size = e->local_world_size = e->nnodes = 1;
  e->master_port = CT_DIST_DEFAULT_PORT;
  snprintf(e->master_addr, sizeof e->master_addr, "127.0.0.1");
  snprintf(e->run_id, sizeof e->run_id, "local");
  e->source = "single";
  ct_status st;
  if (getenv("RANK") && getenv("WORLD_SIZE")) st = detect_launcher(e);
  else if (getenv("OMPI_COMM_WORLD_RANK") && getenv("OMPI_COMM_WORLD_SIZE")) st = detect_openmpi(e);
  /* only inside an srun step: a batch script's own shell has SLURM_PROCID=0 and the job's
   * SLURM_NTASKS too, and a `ctrain train` started there directly is one process */
  else if (getenv("SLURM_PROCID") && getenv("SLURM_STEP_ID")) st = detect_slurm(e);
  else return CT_OK;
  if (st) e->source = "single";
  return st;
}

/* ------------------------------------------------------------------ store */

ct_status ct_dist_store_open(const ct_dist_env *e, double timeout_s, ct_store_server **server,
                             ct_store **client) {
  *server = NULL;
  *client = NULL;
  ct_status st;
  if (!strcmp(e->source, "single")) {
    int port = 0;
    char token[CT_STORE_TOKEN_LEN + 1];
    CT_TRY(ct_store_make_token(token));
    CT_TRY(ct_store_server_start("127.0.0.1", 0, token, server, &port));
    CT_TRY_GOTO(ct_store_server_start_thread(*server), fail);
    CT_TRY_GOTO(ct_store_connect("127.0.0.1", port, token, timeout_s, client), fail);
    return CT_OK;
  }
  /* Single-node srun / mpirun: the first node's name may not resolve inside odd setups, and
   * loopback always reaches rank 0 there. */
  bool one_node = e->nnodes == 1 && strcmp(e->source, "launcher");
  const char *connect_host = one_node ? "127.0.0.1" : e->master_addr;
  if (e->rank0_hosts_store && e->rank == 0) {
    const char *bind_host = is_loopback(e->master_addr) ? e->master_addr : NULL;
    st = ct_store_server_start(bind_host, e->master_port, e->store_token, server, NULL);
    if (st) return ct_add_context(st, "rank 0 (%s) hosting the store: ", e->source);
    CT_TRY_GOTO(ct_store_server_start_thread(*server), fail);
  }
  CT_TRY_GOTO(ct_store_connect(connect_host, e->master_port, e->store_token, timeout_s, client), fail);
  if (!e->rank0_hosts_store) {
    /* the launcher's store outlives a worker group: give each restart fresh keys */
    char prefix[32];
    snprintf(prefix, sizeof prefix, "w%d/", e->restart_count);
    CT_TRY_GOTO(ct_store_set_prefix(*client, prefix), fail);
  }
  return CT_OK;
fail:
  ct_store_close(*client);
  ct_store_server_stop(*server);
  *client = NULL;
  *server = NULL;
  return st;
}

void ct_dist_env_describe(const ct_dist_env *e, char *buf, size_t cap) {
  snprintf(buf, cap, "rank %d/%d (local %d/%d, node %d/%d) via %s, store %s:%d%s", e->rank, e->world_size,
           e->local_rank, e->local_world_size, e->node_rank, e->nnodes, e->source, e->master_addr,
           e->master_port, e->rank0_hosts_store ? " (hosted by rank 0)" : "");
  if (e->restart_count) {
    size_t n = strlen(buf);
    if (n < cap) snprintf(buf + n, cap - n, ", restart %d", e->restart_count);
  }
}

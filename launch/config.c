/* launch/config.c — ctrain-launch's command line -> ct_launch_config. Options come before
 * CONFIG.toml; everything from the first positional argument on is handed to the workers.
 * Option names take '_' or '-' and "--opt value" or "--opt=value", as torchrun's do. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "launch/launch.h"
#include "parallel/env.h"
#include "trainer/device.h"

void ct_launch_usage(FILE *f) {
  fputs(
      "usage: ctrain-launch [options] CONFIG.toml [key=value ...]\n"
      "Runs `ctrain train CONFIG.toml key=value ...` in nproc_per_node worker processes per node,\n"
      "with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,\n"
      "MASTER_ADDR, MASTER_PORT, CTRAIN_RESTART_COUNT, CTRAIN_RUN_ID, CTRAIN_STORE_TOKEN).\n"
      "\n"
      "  --nproc_per_node N|gpu|cpu|auto  workers on this node (gpu/auto: visible CUDA devices,\n"
      "                                   1 without one; cpu: available cores) [1]\n"
      "  --nnodes N|MIN:MAX               nodes in the run; MIN:MAX is elastic (see below) [1]\n"
      "  --node_rank K                    this node, 0..nnodes-1 (node 0 hosts the store); left out\n"
      "                                   on several nodes: the launcher on --master_addr hosts the\n"
      "                                   store and is node 0, the others get 1, 2, ... in the order\n"
      "                                   they join (and keep them across restarts)\n"
      "  --master_addr HOST               node 0's address [127.0.0.1]\n"
      "  --master_port PORT               the store's port on node 0 [29500]\n"
      "  --standalone                     one node, a free port on 127.0.0.1: nothing to set\n"
      "  --max_restarts N                 restart the whole group up to N times after a failure;\n"
      "                                   restarts add train.resume=auto [0]\n"
      "  --monitor_interval S             seconds between health checks [0.5]\n"
      "  --grace_period S                 SIGTERM -> SIGKILL window when stopping workers [60]\n"
      "  --rdzv_timeout S                 how long nodes wait for each other [600]\n"
      "  --rdzv_last_call S               elastic: after MIN nodes joined, wait this long for MAX [30]\n"
      "  --heartbeat_timeout S            a node whose launcher is silent this long is lost [30]\n"
      "  --socket_ifname IF               the workers' NCCL_SOCKET_IFNAME and CTRAIN_SOCKET_IFNAME\n"
      "                                   (Gloo) [multi-node: NCCL_SOCKET_IFNAME from the environment,\n"
      "                                   else the interface that reaches --master_addr; Gloo: the\n"
      "                                   address that reaches --master_addr]\n"
      "  --keep_global_batch[=0|1]        elastic: scale train.grad_accum so the global batch stays\n"
      "                                   that of MAX nodes when it divides evenly [1]\n"
      "  --log_dir DIR                    also write each rank's output to DIR/rank_N.log\n"
      "  --tee[=0|1]                      worker output on the console as \"[rankN]: ...\" lines [1]\n"
      "  --local_ranks_filter 0,1         only these local ranks' output on the console\n"
      "  --run_id ID                      run id for CTRAIN_RUN_ID [random]\n"
      "  --cmd PROGRAM                    run PROGRAM ARGS... instead of ctrain train (tests, tools)\n"
      "  -h, --help                       this text\n"
      "\n"
      "Under srun (one launcher per node: srun --ntasks-per-node=1 ctrain-launch ...), what is not\n"
      "given comes from Slurm: --nnodes (SLURM_STEP_NUM_NODES), --node_rank (SLURM_NODEID),\n"
      "--master_addr (first host of SLURM_STEP_NODELIST), --run_id (slurm-SLURM_JOB_ID) and\n"
      "--master_port (a free one on one node, 29500 + SLURM_JOB_ID % 1000 on several).\n"
      "\n"
      "Signals: SIGINT/SIGTERM/SIGHUP are forwarded, then SIGKILL after the grace period (exit\n"
      "128+signal); SIGUSR1 is forwarded (workers checkpoint and exit) and the launcher exits 0\n"
      "when they do. Multi-node: the store token is CTRAIN_STORE_TOKEN from the environment when\n"
      "set (use the same on every node), else derived from --run_id and the master address.\n"
      "\n"
      "Node health: every launcher heartbeats to node 0's store; a node silent for\n"
      "--heartbeat_timeout is lost: the others stop their workers and fail naming it, or, with\n"
      "restarts left (fixed --nnodes) or at least MIN nodes left (elastic), start again. Losing\n"
      "node 0 (the store) ends the run everywhere.\n"
      "Elastic --nnodes MIN:MAX: the group starts once MIN nodes joined (up to --rdzv_last_call\n"
      "more for MAX); a lost node makes the rest restart with the smaller world from ckpt/latest;\n"
      "a node that arrives while the group runs is admitted at the next restart. Membership\n"
      "changes do not count against --max_restarts.\n",
      f);
}

static const char *const OPTIONS[] = {
    "nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port", "standalone",
    "max_restarts", "monitor_interval", "grace_period", "rdzv_timeout", "rdzv_last_call",
    "heartbeat_timeout", "socket_ifname", "keep_global_batch", "log_dir", "tee",
    "local_ranks_filter", "run_id", "cmd", "help", NULL};

static bool is_flag(const char *name) {
  return !strcmp(name, "standalone") || !strcmp(name, "help") || !strcmp(name, "tee") ||
         !strcmp(name, "keep_global_batch");
}

static ct_status parse_bool(const char *opt, const char *v, bool *out) {
  if (!v || !strcmp(v, "1") || !strcmp(v, "true")) *out = true;
  else if (!strcmp(v, "0") || !strcmp(v, "false")) *out = false;
  else return ct_set_error(CT_ERR_USAGE, "--%s: \"%s\" is not 0 or 1", opt, v);
  return CT_OK;
}

static ct_status parse_int(const char *opt, const char *v, long lo, long hi, int *out) {
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > hi)
    return ct_set_error(CT_ERR_USAGE, "--%s: \"%s\" is not an integer in %ld..%ld", opt, v, lo, hi);
  *out = (int)x;
  return CT_OK;
}

/* --nnodes N or MIN:MAX (torchrun's syntax). */
static ct_status parse_nnodes(const char *v, int *min, int *max) {
  const char *colon = strchr(v, ':');
  if (!colon) {
    CT_TRY(parse_int("nnodes", v, 1, 100000, max));
    *min = *max;
    return CT_OK;
  }
  char a[32];
  size_t al = (size_t)(colon - v);
  if (al == 0 || al >= sizeof a)
    return ct_set_error(CT_ERR_USAGE, "--nnodes: \"%s\" is not N or MIN:MAX", v);
  memcpy(a, v, al);
  a[al] = '\0';
  if (parse_int("nnodes", a, 1, 100000, min) != CT_OK || parse_int("nnodes", colon + 1, 1, 100000, max) != CT_OK)
    return ct_set_error(CT_ERR_USAGE, "--nnodes: \"%s\" is not N or MIN:MAX (counts in 1..100000)", v);
  if (*min > *max) return ct_set_error(CT_ERR_USAGE, "--nnodes %s: MIN is larger than MAX", v);
  return CT_OK;
}

static ct_status parse_seconds(const char *opt, const char *v, double lo, double *out) {
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (errno || end == v || *end || !isfinite(x) || x < lo)
    return ct_set_error(CT_ERR_USAGE, "--%s: \"%s\" is not a number of seconds >= %g", opt, v, lo);
  *out = x;
  return CT_OK;
}

static int available_cpus(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

static ct_status parse_nproc(const char *v, int *out) {
  if (!strcmp(v, "gpu") || !strcmp(v, "auto")) {
    int n = ct_cuda_visible_devices();
    *out = n > 0 ? n : 1; /* no GPU: one CPU worker */
    return CT_OK;
  }
  if (!strcmp(v, "cpu")) {
    *out = available_cpus();
    return CT_OK;
  }
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || end == v || *end || x < 1 || x > 4096)
    return ct_set_error(CT_ERR_USAGE, "--nproc_per_node: \"%s\" is not a count in 1..4096, gpu, cpu or auto", v);
  *out = (int)x;
  return CT_OK;
}

/* The ctrain binary next to this launcher's own executable. */
static ct_status find_ctrain(char *out, size_t cap) {
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return ct_set_error(CT_ERR_USAGE, "cannot read /proc/self/exe to find ctrain: %s; use --cmd", strerror(errno));
  self[n] = '\0';
  char *slash = strrchr(self, '/');
  if (slash) *slash = '\0';
  int w = snprintf(out, cap, "%s/ctrain", self);
  if (w < 0 || (size_t)w >= cap) return ct_set_error(CT_ERR_USAGE, "path of ctrain too long");
  if (access(out, X_OK) != 0)
    return ct_set_error(CT_ERR_USAGE, "cannot find ctrain next to this launcher (%s: %s); use --cmd PROGRAM", out,
                        strerror(errno));
  return CT_OK;
}

/* Integer variable `name` in lo..hi; *found false when unset. */
static ct_status env_num(const char *name, long lo, long hi, int *out, bool *found) {
  const char *v = getenv(name);
  *found = v && v[0];
  if (!*found) return CT_OK;
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > hi)
    return ct_set_error(CT_ERR_USAGE, "under srun: %s=\"%s\" is not an integer in %ld..%ld", name, v, lo, hi);
  *out = (int)x;
  return CT_OK;
}

/* Inside an srun step (SLURM_STEP_ID and SLURM_PROCID set: the batch script itself has
 * SLURM_PROCID=0 but no step id), fills in the layout options the command line left out.
 * One launcher per node is the only layout that makes sense, so more tasks than nodes is a
 * usage error rather than N launchers that all think they are the same node. */
static ct_status from_slurm(ct_launch_config *cfg, bool nnodes_given, bool rank_given, bool addr_given,
                            bool port_given) {
  const char *step = getenv("SLURM_STEP_ID"), *procid = getenv("SLURM_PROCID");
  if (cfg->standalone || !step || !step[0] || !procid || !procid[0]) return CT_OK;
  int nodes = 1, tasks = 1, node = 0;
  bool found;
  CT_TRY(env_num("SLURM_STEP_NUM_NODES", 1, 100000, &nodes, &found));
  if (!found) CT_TRY(env_num("SLURM_NNODES", 1, 100000, &nodes, &found));
  CT_TRY(env_num("SLURM_STEP_NUM_TASKS", 1, 10000000, &tasks, &found));
  if (!found) CT_TRY(env_num("SLURM_NTASKS", 1, 10000000, &tasks, &found));
  if (!found) tasks = nodes;
  CT_TRY(env_num("SLURM_NODEID", 0, nodes - 1, &node, &found));
  if ((!nnodes_given || !rank_given) && tasks != nodes)
    return ct_set_error(CT_ERR_USAGE, "under srun with %d tasks on %d node%s: start one ctrain-launch per node "
                        "(srun --ntasks-per-node=1 ctrain-launch ...), or one `ctrain train` per GPU "
                        "(srun --ntasks-per-node=G ctrain train ...)", tasks, nodes, nodes == 1 ? "" : "s");
  if (!nnodes_given) cfg->nnodes = cfg->min_nodes = nodes;
  if (!rank_given) cfg->node_rank = node;
  const char *job = getenv("SLURM_JOB_ID");
  if (!job || !job[0]) job = getenv("SLURM_JOBID");
  if (!cfg->run_id[0] && job && job[0]) snprintf(cfg->run_id, sizeof cfg->run_id, "slurm-%.100s", job);
  if (cfg->nnodes == 1) {
    /* one node: the workers are ours; a free port cannot collide with another job's */
    if (!port_given) cfg->master_port = 0;
    return CT_OK;
  }
  if (!port_given) /* every node must compute the same port without talking first */
    cfg->master_port = CT_DIST_DEFAULT_PORT + (int)((job ? strtoul(job, NULL, 10) : 0) % 1000);
  if (!addr_given) {
    const char *list = getenv("SLURM_STEP_NODELIST");
    if (!list || !list[0]) list = getenv("SLURM_JOB_NODELIST");
    if (!list || !list[0])
      return ct_set_error(CT_ERR_USAGE, "under srun on %d nodes but SLURM_STEP_NODELIST is unset: give --master_addr",
                          cfg->nnodes);
    char **names;
    int n;
    CT_TRY(ct_slurm_expand_nodelist(list, &names, &n));
    snprintf(cfg->master_addr, sizeof cfg->master_addr, "%s", names[0]); /* node 0 is the list's first */
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
  }
  return CT_OK;
}

static ct_status unknown_option(const char *arg, const char *name) {
  const char *best = NULL;
  int bestd = 4;
  for (int i = 0; OPTIONS[i]; i++) {
    int d = ct_edit_distance(name, OPTIONS[i]);
    if (d < bestd) { bestd = d; best = OPTIONS[i]; }
  }
  if (best) return ct_set_error(CT_ERR_USAGE, "unknown option %s; did you mean --%s?", arg, best);
  return ct_set_error(CT_ERR_USAGE, "unknown option %s (see --help)", arg);
}

ct_status ct_launch_parse(int argc, char **argv, ct_launch_config *cfg, bool *help) {
  *help = false;
  const char *nproc = "1", *filter = NULL, *cmd = NULL;
  bool port_given = false, addr_given = false, nnodes_given = false, rank_given = false;
  int i = 1;
  for (; i < argc; i++) {
    const char *arg = argv[i];
    if (!strcmp(arg, "--")) { i++; break; }
    if (!strcmp(arg, "-h")) { *help = true; break; }
    if (strncmp(arg, "--", 2) != 0) break; /* first positional: the rest goes to the workers */
    char name[64];
    const char *eq = strchr(arg + 2, '=');
    size_t nl = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
    if (nl == 0 || nl >= sizeof name) return unknown_option(arg, arg + 2);
    memcpy(name, arg + 2, nl);
    name[nl] = '\0';
    for (char *p = name; *p; p++)
      if (*p == '-') *p = '_';
    bool known = false;
    for (int k = 0; OPTIONS[k]; k++) known |= !strcmp(name, OPTIONS[k]);
    if (!known) return unknown_option(arg, name);
    const char *val = eq ? eq + 1 : NULL;
    if (!val && !is_flag(name)) {
      if (i + 1 >= argc) return ct_set_error(CT_ERR_USAGE, "--%s needs a value", name);
      val = argv[++i];
    }
    if (!strcmp(name, "help")) { *help = true; break; }
    else if (!strcmp(name, "nproc_per_node")) nproc = val;
    else if (!strcmp(name, "nnodes")) {
      CT_TRY(parse_nnodes(val, &cfg->min_nodes, &cfg->nnodes));
      nnodes_given = true;
    }
    else if (!strcmp(name, "node_rank")) { CT_TRY(parse_int(name, val, 0, 100000, &cfg->node_rank)); rank_given = true; }
    else if (!strcmp(name, "master_addr")) {
      if (!val[0] || strlen(val) >= sizeof cfg->master_addr) return ct_set_error(CT_ERR_USAGE, "--master_addr: bad host \"%s\"", val);
      snprintf(cfg->master_addr, sizeof cfg->master_addr, "%s", val);
      addr_given = true;
    }
    else if (!strcmp(name, "master_port")) { CT_TRY(parse_int(name, val, 0, 65535, &cfg->master_port)); port_given = true; }
    else if (!strcmp(name, "standalone")) {
      if (val) return ct_set_error(CT_ERR_USAGE, "--standalone takes no value");
      cfg->standalone = true;
    }
    else if (!strcmp(name, "max_restarts")) CT_TRY(parse_int(name, val, 0, 1000000, &cfg->max_restarts));
    else if (!strcmp(name, "monitor_interval")) CT_TRY(parse_seconds(name, val, 0.001, &cfg->monitor_interval));
    else if (!strcmp(name, "grace_period")) CT_TRY(parse_seconds(name, val, 0, &cfg->grace_period));
    else if (!strcmp(name, "rdzv_timeout")) CT_TRY(parse_seconds(name, val, 0.1, &cfg->rdzv_timeout));
    else if (!strcmp(name, "rdzv_last_call")) CT_TRY(parse_seconds(name, val, 0, &cfg->rdzv_last_call));
    else if (!strcmp(name, "heartbeat_timeout")) CT_TRY(parse_seconds(name, val, 0.5, &cfg->heartbeat_timeout));
    else if (!strcmp(name, "keep_global_batch")) CT_TRY(parse_bool(name, val, &cfg->keep_global_batch));
    else if (!strcmp(name, "socket_ifname")) {
      if (!val[0] || strlen(val) >= sizeof cfg->socket_ifname || strpbrk(val, " =/"))
        return ct_set_error(CT_ERR_USAGE, "--socket_ifname: bad interface name \"%s\"", val);
      snprintf(cfg->socket_ifname, sizeof cfg->socket_ifname, "%s", val);
    }
    else if (!strcmp(name, "log_dir")) {
      if (!val[0] || strlen(val) >= sizeof cfg->log_dir - 32) return ct_set_error(CT_ERR_USAGE, "--log_dir: bad path \"%s\"", val);
      snprintf(cfg->log_dir, sizeof cfg->log_dir, "%s", val);
    }
    else if (!strcmp(name, "tee")) CT_TRY(parse_bool(name, val, &cfg->tee));
    else if (!strcmp(name, "local_ranks_filter")) filter = val;
    else if (!strcmp(name, "run_id")) {
      if (!val[0] || strlen(val) >= sizeof cfg->run_id) return ct_set_error(CT_ERR_USAGE, "--run_id: bad id \"%s\"", val);
      snprintf(cfg->run_id, sizeof cfg->run_id, "%s", val);
    }
    else if (!strcmp(name, "cmd")) cmd = val;
  }
  if (*help) {
    ct_launch_usage(stdout);
    return CT_OK;
  }
  cfg->nargs = argc - i;
  cfg->args = argv + i;

  CT_TRY(parse_nproc(nproc, &cfg->nproc_per_node));
  CT_TRY(from_slurm(cfg, nnodes_given, rank_given, addr_given, port_given));
  if (cfg->standalone) {
    if (cfg->nnodes != 1 || cfg->node_rank > 0)
      return ct_set_error(CT_ERR_USAGE, "--standalone runs one node: drop --nnodes / --node_rank");
    if (addr_given || port_given)
      return ct_set_error(CT_ERR_USAGE, "--standalone picks its own address and port: drop --master_addr / --master_port");
    snprintf(cfg->master_addr, sizeof cfg->master_addr, "127.0.0.1");
    cfg->master_port = 0;
  }
  if (cfg->node_rank >= cfg->nnodes)
    return ct_set_error(CT_ERR_USAGE, "--node_rank %d must be below --nnodes %d", cfg->node_rank, cfg->nnodes);
  if (cfg->nnodes == 1) cfg->node_rank = 0; /* one node: nothing to assign */
  if (cfg->master_port == 0 && cfg->nnodes > 1)
    return ct_set_error(CT_ERR_USAGE, "--master_port 0 (a free port) works only on one node: the other nodes must know the port");
  if (filter) {
    cfg->show_local = calloc((size_t)cfg->nproc_per_node, sizeof *cfg->show_local);
    if (!cfg->show_local) return ct_set_error(CT_ERR_NOMEM, "out of memory");
    const char *p = filter;
    while (*p) {
      char *end;
      errno = 0;
      long r = strtol(p, &end, 10);
      if (errno || end == p || (*end && *end != ',') || r < 0 || r >= cfg->nproc_per_node)
        return ct_set_error(CT_ERR_USAGE, "--local_ranks_filter \"%s\": want local ranks in 0..%d separated by commas",
                            filter, cfg->nproc_per_node - 1);
      cfg->show_local[r] = true;
      p = *end ? end + 1 : end;
    }
  }
  if (cmd) {
    if (!cmd[0] || strlen(cmd) >= sizeof cfg->program) return ct_set_error(CT_ERR_USAGE, "--cmd: bad program \"%s\"", cmd);
    snprintf(cfg->program, sizeof cfg->program, "%s", cmd);
    cfg->custom_cmd = true;
  } else {
    if (cfg->nargs < 1) return ct_set_error(CT_ERR_USAGE, "missing CONFIG.toml (usage: ctrain-launch [options] CONFIG.toml [key=value ...])");
    CT_TRY(find_ctrain(cfg->program, sizeof cfg->program));
  }
  return CT_OK;
}

void ct_launch_config_free(ct_launch_config *cfg) {
  free(cfg->show_local);
  cfg->show_local = NULL;
}

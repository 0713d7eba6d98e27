/* launch/agent.c — the ctrain-launch agent: one worker group per node, driven by an event loop.
 *
 * The loop (redis `ae` style) polls a signalfd (SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGCHLD are
 * blocked and read from it, so no work happens in a signal handler), every worker's stdout and
 * stderr pipes, and on node 0 the store's sockets; it wakes for the monitor timer, the grace
 * deadline, the heartbeat timer and the store's parked-request deadlines. Children are reaped
 * with waitpid(-1, WNOHANG) on every turn; the launcher is a child subreaper, so anything a
 * worker leaves behind is reparented to it and reaped too: no zombies.
 *
 * Worker group states (torchrun's WorkerState):
 *   INIT       rendezvous (multi-node: the launchers join a round through the store and node 0
 *              closes it, assigning node ranks), then spawn                  -> HEALTHY
 *   HEALTHY    workers running. All exit 0 (on every node)                  -> SUCCEEDED
 *              one fails, another node reports a failure, or a node is lost:
 *              stop the rest                                                -> UNHEALTHY
 *   UNHEALTHY  stopping (SIGTERM, grace period, SIGKILL); when all are gone: restart
 *              (INIT, CTRAIN_RESTART_COUNT + 1) or                          -> FAILED
 *              (multi-node: node 0 decides, once every node of the round has stopped or is
 *              lost, and tells the others: one verdict for the whole run)
 *   STOPPED    the launcher got SIGINT/SIGTERM/SIGHUP: forwarded, then stop as above, exit
 *              128 + signal.
 *
 * Multi-node. Node 0's launcher hosts the store (given --node_rank 0, or, with --node_rank left
 * out, the launcher that can listen on --master_addr); every other launcher is a client with a
 * launcher id from the store (1, 2, ... in the order they connect; node 0 is id 0). Keys:
 *   launch/nodes            counter: launcher ids handed out
 *   launch/node/<id>        "<nproc> <asked node_rank or -1> <address> <hostname>"
 *   launch/hb/<id>          counter: the launcher's heartbeat (every heartbeat_timeout / 5)
 *   launch/lost/<id>        set by node 0: it declared that launcher lost (no heartbeat)
 *   launch/bye/<id>         the launcher is exiting (node 0 keeps the store up until all did)
 *   launch/round            the round node 0 is forming now (round = CTRAIN_RESTART_COUNT)
 *   launch/<r>/in/<id>      the launcher joined round r
 *   launch/<r>/go           "<nnodes> <count> <id>:<node_rank>... <run id>": round r closed
 *                           (a launcher that joined but is not listed waits for round r+1)
 *   launch/<r>/failed       "<code> <kind> <node> <text>", the round's first failure; kind 0:
 *                           no restart (signal, usage), 1: a worker failed, 2: a node was lost
 *   launch/<r>/stopped/<id> that launcher's workers are gone after the failure
 *   launch/<r>/verdict      node 0's decision: "restart <restarts counted> <membership 0|1>"
 *                           or "fail <code> <text>"
 *   launch/<r>/done         counter of nodes whose workers all exited 0; launch/<r>/alldone
 *   launch/final            node 0's exit code, for launchers still waiting to be admitted
 * Node 0 watches the heartbeats of every launcher; one silent for --heartbeat_timeout is lost:
 * its node's failure stops the round. The other launchers' store calls are bounded by the
 * same timeout (ct_store_set_io_timeout), so a node cut off from node 0 fails on its own
 * within about that time. Node 0 is the store: when it goes, the run ends everywhere.
 *
 * Node ranks: node 0 is 0; then a launcher keeps the rank it had in the previous round when it
 * is below the new node count, a launcher given --node_rank gets that rank, and the rest take
 * the lowest free ranks in the order they joined.
 *
 * Elastic (--nnodes MIN:MAX): node 0 closes round 0 when MAX nodes joined, or MIN joined and
 * --rdzv_last_call passed since; a later round when MAX joined, or at least MIN and every live
 * launcher did. A lost node with at least MIN left restarts the group with the nodes left
 * (train.resume=auto; checkpoints reshard to any world size) without counting against
 * --max_restarts; a launcher that arrives while a round runs waits for the next restart.
 * With --keep_global_batch (the default), train.grad_accum is scaled so that micro_batch x
 * grad_accum x world stays that of MAX nodes whenever that divides evenly.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "launch/launch.h"
#include "parallel/store.h"
#include "trainer/config.h"

extern char **environ;

typedef enum { G_INIT, G_HEALTHY, G_UNHEALTHY, G_SUCCEEDED, G_FAILED, G_STOPPED } group_state;

static const char *const STATE_NAMES[] = {"INIT", "HEALTHY", "UNHEALTHY", "SUCCEEDED", "FAILED", "STOPPED"};

enum { KIND_ABORT = 0, KIND_WORKER = 1, KIND_LOST = 2 }; /* launch/<r>/failed kinds */

/* Node 0's view of one launcher (index = launcher id; 0 is node 0 itself). */
typedef struct member {
  bool known;          /* its launch/node/<id> was read */
  int nproc, asked;    /* --nproc_per_node; --node_rank or -1 */
  char addr[64], host[128];
  int64_t hb;          /* last heartbeat counter seen */
  double seen;         /* when it last changed (node 0's clock) */
  bool lost, left;     /* declared lost; said bye */
  int rank, prev_rank; /* node rank in this round / the last one, -1 when none */
  bool joined;         /* joined the round being formed */
} member;

typedef struct agent {
  const ct_launch_config *cfg;
  group_state state;
  int round;    /* group generation: the CTRAIN_RESTART_COUNT of the current group */
  int restarts; /* restarts counted against --max_restarts */
  int n;        /* workers on this node */
  ct_worker *w;
  int world, prev_world;
  int node_rank, nnodes, prev_nnodes; /* this round's */
  /* rendezvous */
  bool host;               /* hosts the store: node 0 */
  ct_store_server *server; /* node 0 */
  ct_store *client;        /* other nodes */
  int id;                  /* launcher id (0 on node 0, -1 before registering) */
  char store_host[256];
  int port;
  char token[128];
  char run_id[128];
  char my_addr[64], ifname[64]; /* the local address that reaches node 0, and its interface */
  bool joined, waiting, done_published, said_bye, store_lost, acked;
  double rdzv_deadline, connect_next, next_hb, min_reached_at;
  member *m;
  int nm, capm;
  /* stopping */
  bool stopping, killed;
  double kill_at, give_up_at;
  /* outcome */
  bool have_failure, restartable, lost_in_round;
  int fail_kind, exit_code;
  char summary[512];   /* one line: what failed */
  char lost_text[400]; /* node 0: which node of the round was lost */
  int signal_got;      /* SIGINT/SIGTERM/SIGHUP received */
  bool preempted;      /* SIGUSR1 received: no restarts */
  int sigfd;
  double next_tick;
  /* elastic global batch */
  int grad_accum0; /* the config's train.grad_accum; 0 = unknown (no scaling) */
  /* extra worker variables (NCCL_SOCKET_IFNAME, ...) */
  char extra_env[3][128];
  int nextra;
} agent;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
  char buf[16384];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  size_t len = (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1;
  /* one write: the block stays together even with workers writing to the same terminal */
  fflush(stdout);
  ssize_t w = write(STDERR_FILENO, buf, len);
  (void)w;
}

static void set_state(agent *a, group_state s) {
  if (getenv("CTRAIN_LAUNCH_DEBUG")) say("ctrain-launch: state %s -> %s\n", STATE_NAMES[a->state], STATE_NAMES[s]);
  a->state = s;
}

static bool multi(const agent *a) { return a->cfg->nnodes > 1; }
static bool elastic(const agent *a) { return a->cfg->min_nodes < a->cfg->nnodes; }

/* ------------------------------------------------------------------ store access */
/* Node 0 reads and writes its own server's table directly (it cannot be a blocking client of
 * its own loop); the other nodes use a client. The client calls are quick round trips. */

static ct_status kv_set(agent *a, const char *key, const char *val) {
  if (a->server) return ct_store_server_local_set(a->server, key, val, strlen(val));
  if (!a->client) return ct_set_error(CT_ERR_RUNTIME, "not connected to the store");
  return ct_store_set(a->client, key, val, strlen(val));
}

static ct_status kv_add(agent *a, const char *key, int64_t delta, int64_t *out) {
  if (a->server) return ct_store_server_local_add(a->server, key, delta, out);
  if (!a->client) return ct_set_error(CT_ERR_RUNTIME, "not connected to the store");
  return ct_store_add(a->client, key, delta, out);
}

/* Non-blocking read: *found false when the key is absent. */
static ct_status kv_peek(agent *a, const char *key, char *out, size_t cap, bool *found) {
  out[0] = '\0';
  *found = false;
  if (a->server) {
    const void *v;
    size_t len;
    CT_TRY(ct_store_server_local_get(a->server, key, &v, &len, found));
    if (*found) snprintf(out, cap, "%.*s", (int)len, (const char *)v);
    return CT_OK;
  }
  if (!a->client) return ct_set_error(CT_ERR_RUNTIME, "not connected to the store");
  CT_TRY(ct_store_check(a->client, key, found));
  if (!*found) return CT_OK;
  void *v;
  size_t len;
  CT_TRY(ct_store_get(a->client, key, 5, &v, &len));
  snprintf(out, cap, "%.*s", (int)len, (const char *)v);
  free(v);
  return CT_OK;
}

static void round_key(const agent *a, char *buf, size_t cap, const char *what) {
  snprintf(buf, cap, "launch/%d/%s", a->round, what);
}

/* ------------------------------------------------------------------ workers */

static bool group_running(const agent *a) {
  for (int i = 0; i < a->n; i++)
    if (a->w[i].running || a->w[i].group_alive) return true;
  return false;
}

static void signal_all(agent *a, int sig) {
  for (int i = 0; i < a->n; i++) ct_worker_signal(&a->w[i], sig);
}

static void begin_stop(agent *a, int sig) {
  if (!a->stopping) {
    a->stopping = true;
    a->killed = false;
    a->kill_at = ct_now() + a->cfg->grace_period;
  }
  signal_all(a, sig);
}

/* Advances a stop in progress: SIGKILL at the grace deadline. Returns true when every worker's
 * process group is gone. */
static bool stop_progress(agent *a) {
  for (int i = 0; i < a->n; i++) ct_worker_check_group(&a->w[i]);
  if (!group_running(a)) {
    a->stopping = false;
    return true;
  }
  double now = ct_now();
  if (!a->killed && now >= a->kill_at) {
    char sb[32];
    for (int i = 0; i < a->n; i++)
      if (a->w[i].running || a->w[i].group_alive)
        say("ctrain-launch: rank %d (pid %d) still running after the %g s grace period: sending %s\n",
            a->w[i].rank, (int)a->w[i].pid, a->cfg->grace_period, ct_signal_name(SIGKILL, sb, sizeof sb));
    signal_all(a, SIGKILL);
    a->killed = true;
    a->give_up_at = now + 10.0;
  } else if (a->killed && now >= a->give_up_at) {
    /* a process stuck in the kernel (D state) ignores even SIGKILL; do not hang on it */
    for (int i = 0; i < a->n; i++)
      if (a->w[i].running || a->w[i].group_alive)
        say("ctrain-launch: warning: process group %d of rank %d survived SIGKILL for 10 s\n", (int)a->w[i].pid,
            a->w[i].rank);
    a->stopping = false;
    return true;
  }
  return false;
}

/* "exited with code 3" / "killed by SIGKILL"; returns the exit code the launcher would use. */
static int describe_status(int st, char *buf, size_t cap) {
  char sb[32];
  if (WIFSIGNALED(st)) {
    int sig = WTERMSIG(st);
    snprintf(buf, cap, "killed by %s%s", ct_signal_name(sig, sb, sizeof sb), WCOREDUMP(st) ? " (core dumped)" : "");
    return 128 + sig;
  }
  int code = WIFEXITED(st) ? WEXITSTATUS(st) : 1;
  snprintf(buf, cap, "exited with code %d", code);
  return code;
}

static bool restart_left(const agent *a) {
  return a->restartable && a->restarts < a->cfg->max_restarts && !a->preempted && !a->signal_got;
}

static void publish_failure(agent *a, int code, int kind, const char *text) {
  if (!multi(a) || a->store_lost || (!a->server && !a->client)) return;
  char key[128], val[700];
  round_key(a, key, sizeof key, "failed");
  bool found = false;
  char old[16];
  /* the round's first failure stays (the others are its consequences) */
  if (kind != KIND_ABORT && kv_peek(a, key, old, sizeof old, &found) == CT_OK && found) return;
  snprintf(val, sizeof val, "%d %d %d %s", code, kind, a->node_rank, text);
  if (kv_set(a, key, val) != CT_OK) {
    say("ctrain-launch: warning: could not tell the other nodes: %s\n", ct_last_error());
    ct_clear_error();
  }
}

/* Records the group's first failure and reports it in one block. */
static void record_local_failure(agent *a, ct_worker *w) {
  char what[128], sb[32];
  int code = describe_status(w->wait_status, what, sizeof what);
  ct_worker_drain(w);
  a->have_failure = true;
  a->restartable = true;
  a->fail_kind = KIND_WORKER;
  a->exit_code = code;
  snprintf(a->summary, sizeof a->summary, "rank %d (local_rank %d on node %d) %s", w->rank, w->local_rank,
           a->node_rank, what);
  char block[12288];
  int n = snprintf(block, sizeof block,
                   "ctrain-launch: worker failure: rank %d (local_rank %d on node %d, pid %d) %s\n",
                   w->rank, w->local_rank, a->node_rank, (int)w->pid, what);
  if (w->tail_count) {
    snprintf(block + n, sizeof block - (size_t)n, "  last %d line%s of rank %d's output:\n", w->tail_count,
             w->tail_count == 1 ? "" : "s", w->rank);
    ct_worker_format_tail(w, block, sizeof block);
  } else {
    snprintf(block + n, sizeof block - (size_t)n, "  (rank %d wrote no output)\n", w->rank);
  }
  size_t used = strlen(block);
  bool others = false;
  for (int i = 0; i < a->n; i++) others |= &a->w[i] != w && (a->w[i].running || a->w[i].group_alive);
  if (others || multi(a))
    snprintf(block + used, sizeof block - used, "  stopping the other workers (%s, %s after %g s)%s\n",
             ct_signal_name(SIGTERM, sb, sizeof sb), ct_signal_name(SIGKILL, sb + 16, 16), a->cfg->grace_period,
             !multi(a) && restart_left(a) ? "; the group will restart" : "");
  say("%s", block);
  publish_failure(a, code, KIND_WORKER, a->summary);
}

/* Another node's failure (or a lost store): stop ours too. */
static void record_remote_failure(agent *a, int code, int kind, const char *text) {
  if (a->have_failure) return;
  a->have_failure = true;
  a->fail_kind = kind;
  a->restartable = kind != KIND_ABORT;
  a->exit_code = code;
  snprintf(a->summary, sizeof a->summary, "%s", text);
  if (group_running(a)) say("ctrain-launch: %s; stopping the workers on node %d\n", text, a->node_rank);
  else if (a->state != G_INIT) say("ctrain-launch: %s\n", text);
}

/* The store went away (node 0 gone, or the link to it cut): no verdict can come. */
static void store_gone(agent *a, const char *during) {
  char text[700];
  snprintf(text, sizeof text, "lost the store at %s:%d%s (node 0's launcher gone, or the link to it cut?): %s",
           a->store_host, a->port, during, ct_last_error());
  ct_clear_error();
  a->store_lost = true;
  if (!a->have_failure) {
    record_remote_failure(a, 1, KIND_ABORT, text);
  } else {
    a->restartable = false;
  }
}

/* Extra variables for the workers: the socket interface for NCCL (and Gloo with --socket_ifname). */
static void add_extra(agent *a, const char *name, const char *val) {
  if (a->nextra < 3) snprintf(a->extra_env[a->nextra++], sizeof a->extra_env[0], "%s=%s", name, val);
}

/* NULL-terminated environment for one worker: ours, minus the variables we set, plus them. */
static char **worker_env(const agent *a, const ct_worker *w) {
  static const char *const OURS[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                     "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                     "CTRAIN_RESTART_COUNT", "CTRAIN_MAX_RESTARTS", "CTRAIN_RUN_ID",
                                     "CTRAIN_STORE_TOKEN", NULL};
  size_t n = 0;
  while (environ[n]) n++;
  char **env = calloc(n + 24, sizeof *env);
  if (!env) return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    bool ours = false;
    for (int j = 0; OURS[j] && !ours; j++) {
      size_t l = strlen(OURS[j]);
      ours = !strncmp(environ[i], OURS[j], l) && environ[i][l] == '=';
    }
    for (int j = 0; j < a->nextra && !ours; j++) {
      size_t l = (size_t)(strchr(a->extra_env[j], '=') - a->extra_env[j]) + 1;
      ours = !strncmp(environ[i], a->extra_env[j], l);
    }
    if (!ours) env[k++] = ct_strdup(environ[i]);
  }
  const ct_launch_config *c = a->cfg;
#define ADD(...)                                               \
  do {                                                         \
    char b_[600];                                              \
    snprintf(b_, sizeof b_, __VA_ARGS__);                      \
    env[k++] = ct_strdup(b_);                                  \
  } while (0)
  ADD("RANK=%d", w->rank);
  ADD("LOCAL_RANK=%d", w->local_rank);
  ADD("WORLD_SIZE=%d", a->world);
  ADD("LOCAL_WORLD_SIZE=%d", a->n);
  ADD("GROUP_RANK=%d", a->node_rank);
  ADD("ROLE_RANK=%d", w->rank);
  ADD("ROLE_WORLD_SIZE=%d", a->world);
  ADD("MASTER_ADDR=%s", a->store_host);
  ADD("MASTER_PORT=%d", a->port);
  ADD("CTRAIN_RESTART_COUNT=%d", a->round);
  ADD("CTRAIN_MAX_RESTARTS=%d", c->max_restarts);
  ADD("CTRAIN_RUN_ID=%s", a->run_id);
  ADD("CTRAIN_STORE_TOKEN=%s", a->token);
  if (a->n > 1 && !getenv("OMP_NUM_THREADS")) ADD("OMP_NUM_THREADS=1");
  for (int j = 0; j < a->nextra; j++) ADD("%s", a->extra_env[j]);
#undef ADD
  env[k] = NULL;
  return env;
}

static void free_strv(char **v) {
  if (!v) return;
  for (size_t i = 0; v[i]; i++) free(v[i]);
  free(v);
}

/* Elastic runs: the train.grad_accum that keeps micro_batch x grad_accum x world at its value
 * for MAX nodes, or 0 to leave the config's (explained once per round). */
static int scaled_grad_accum(agent *a) {
  if (!a->grad_accum0) return 0;
  int ref = a->cfg->nnodes * a->n;
  if (a->world == ref) return 0;
  long long total = (long long)a->grad_accum0 * ref;
  if (total % a->world) {
    say("ctrain-launch: note: world size %d: train.grad_accum %d x %d/%d is not a whole number; the global "
        "batch is %d x grad_accum %d sequences instead of %lld\n", a->world, a->grad_accum0, ref, a->world,
        a->world, a->grad_accum0, total);
    return 0;
  }
  int g = (int)(total / a->world);
  say("ctrain-launch: world size %d: train.grad_accum=%d (config: %d) keeps the global batch of world size %d "
      "(micro_batch x %d x %d)\n", a->world, g, a->grad_accum0, ref, a->grad_accum0, ref);
  return g;
}

static ct_status spawn_all(agent *a) {
  const ct_launch_config *c = a->cfg;
  /* argv: ctrain train ARGS... [train.resume=auto] [train.grad_accum=G], or PROGRAM ARGS... */
  char **argv = calloc((size_t)c->nargs + 5, sizeof *argv);
  if (!argv) return ct_set_error(CT_ERR_NOMEM, "out of memory");
  char accum[64];
  int k = 0;
  argv[k++] = (char *)c->program;
  if (!c->custom_cmd) argv[k++] = "train";
  for (int i = 0; i < c->nargs; i++) argv[k++] = c->args[i];
  /* a restarted group resumes from ckpt/latest (a later key=value wins over the user's) */
  if (!c->custom_cmd && a->round > 0) argv[k++] = "train.resume=auto";
  if (!c->custom_cmd) {
    int g = scaled_grad_accum(a);
    if (g) {
      snprintf(accum, sizeof accum, "train.grad_accum=%d", g);
      argv[k++] = accum;
    }
  }
  argv[k] = NULL;
  ct_status st = CT_OK;
  for (int i = 0; i < a->n && st == CT_OK; i++) {
    ct_worker *w = &a->w[i];
    w->rank = a->node_rank * a->n + i;
    char **env = worker_env(a, w);
    if (!env) { st = ct_set_error(CT_ERR_NOMEM, "out of memory"); break; }
    st = ct_worker_spawn(w, argv, env, c->log_dir, a->round);
    free_strv(env);
  }
  free(argv);
  return st;
}

/* Reaps every child that has exited: workers and anything reparented to us. */
static void reap(agent *a) {
  for (;;) {
    int st;
    pid_t pid = waitpid(-1, &st, WNOHANG);
    if (pid <= 0) return;
    for (int i = 0; i < a->n; i++) {
      ct_worker *w = &a->w[i];
      if (w->running && w->pid == pid) {
        w->running = false;
        w->wait_status = st;
      }
    }
  }
}

static void release_workers(agent *a) {
  for (int i = 0; i < a->n; i++) {
    ct_worker_drain(&a->w[i]);
    ct_worker_release(&a->w[i]);
    int lr = a->w[i].local_rank, r = a->w[i].rank;
    bool show = a->w[i].show;
    memset(&a->w[i], 0, sizeof a->w[i]);
    a->w[i].local_rank = lr;
    a->w[i].rank = r;
    a->w[i].show = show;
    a->w[i].out_fd = a->w[i].err_fd = a->w[i].log_fd = -1;
  }
}

/* ------------------------------------------------------------------ node 0: membership */

static member *member_at(agent *a, int id) {
  if (id >= a->capm) {
    int cap = a->capm ? a->capm : 8;
    while (cap <= id) cap *= 2;
    member *m = realloc(a->m, (size_t)cap * sizeof *m);
    if (!m) return NULL;
    memset(m + a->capm, 0, (size_t)(cap - a->capm) * sizeof *m);
    for (int i = a->capm; i < cap; i++) m[i].rank = m[i].prev_rank = -1;
    a->m = m;
    a->capm = cap;
  }
  if (id >= a->nm) a->nm = id + 1;
  return &a->m[id];
}

/* "node 1 (10.0.0.2, host b)" or "launcher 3 (...)" for one not in the round. */
static void member_name(const agent *a, int id, char *buf, size_t cap) {
  const member *m = &a->m[id];
  int r = m->rank >= 0 ? m->rank : m->prev_rank;
  if (r >= 0) snprintf(buf, cap, "node %d (%s, host %s)", r, m->addr, m->host);
  else snprintf(buf, cap, "launcher %d (%s, host %s; not in the group yet)", id, m->addr, m->host);
}

static int alive_count(const agent *a) {
  int k = 0;
  for (int i = 0; i < a->nm; i++) k += a->m[i].known && !a->m[i].lost && !a->m[i].left;
  return k;
}

/* A launcher went silent: tell it (should it still be there) and fail the round it is in. */
static void declare_lost(agent *a, int id, double silent) {
  member *m = &a->m[id];
  m->lost = true;
  char name[300], text[400], key[64];
  member_name(a, id, name, sizeof name);
  snprintf(text, sizeof text, "%s lost: no heartbeat for %.1f s", name, silent);
  snprintf(key, sizeof key, "launch/lost/%d", id);
  kv_set(a, key, text);
  bool in_round = m->rank >= 0; /* else waiting for admission, or not joined: nothing runs there */
  if (in_round && !a->lost_in_round) snprintf(a->lost_text, sizeof a->lost_text, "%s", text);
  a->lost_in_round |= in_round;
  if (in_round && a->state == G_HEALTHY && !a->have_failure) {
    record_remote_failure(a, 1, KIND_LOST, text); /* says it */
    publish_failure(a, 1, KIND_LOST, text);
  } else {
    say("ctrain-launch: %s\n", text);
  }
}

/* Node 0, every turn: new launchers, heartbeats, byes. Reads only its own table. */
static void host_scan(agent *a) {
  char val[512], key[128];
  bool found;
  kv_peek(a, "launch/nodes", val, sizeof val, &found);
  int count = found ? atoi(val) : 0;
  double now = ct_now();
  for (int id = 1; id <= count; id++) {
    member *m = member_at(a, id);
    if (!m) return;
    if (!m->known) {
      snprintf(key, sizeof key, "launch/node/%d", id);
      kv_peek(a, key, val, sizeof val, &found);
      if (!found) continue;
      m->addr[0] = m->host[0] = '\0';
      sscanf(val, "%d %d %63s %127s", &m->nproc, &m->asked, m->addr, m->host);
      m->known = true;
      m->seen = now;
      m->hb = -1;
    }
    if (m->lost || m->left) continue;
    snprintf(key, sizeof key, "launch/bye/%d", id);
    kv_peek(a, key, val, sizeof val, &found);
    if (found) {
      m->left = true;
      continue;
    }
    snprintf(key, sizeof key, "launch/hb/%d", id);
    kv_peek(a, key, val, sizeof val, &found);
    int64_t hb = found ? strtoll(val, NULL, 10) : 0;
    if (hb != m->hb) {
      m->hb = hb;
      m->seen = now;
    } else if (now - m->seen > a->cfg->heartbeat_timeout) {
      declare_lost(a, id, now - m->seen);
    }
  }
}

/* Node 0: a new round (after a restart verdict, or round 0 at start). */
static void host_open_round(agent *a) {
  char v[32];
  snprintf(v, sizeof v, "%d", a->round);
  kv_set(a, "launch/round", v);
  for (int i = 0; i < a->nm; i++) {
    a->m[i].prev_rank = a->m[i].rank;
    a->m[i].rank = -1;
    a->m[i].joined = false;
  }
  a->min_reached_at = -1;
  a->lost_in_round = false;
  a->lost_text[0] = '\0';
}

/* Node 0: closes the round with the joined launchers in `ids` (nj of them, node 0 first):
 * admits up to MAX, assigns node ranks, publishes "go". False (and a failure) on a conflict. */
static bool host_close_round(agent *a, int *ids, int nj) {
  const ct_launch_config *c = a->cfg;
  /* admission order: node 0, the previous round's nodes by rank, --node_rank askers, the rest
   * by launcher id (= arrival order) */
  for (int i = 1; i < nj; i++)
    for (int j = i; j > 1; j--) {
      const member *x = &a->m[ids[j - 1]], *y = &a->m[ids[j]];
      int kx = x->prev_rank >= 0 ? x->prev_rank : x->asked >= 0 ? 100000 + x->asked : 200000 + ids[j - 1];
      int ky = y->prev_rank >= 0 ? y->prev_rank : y->asked >= 0 ? 100000 + y->asked : 200000 + ids[j];
      if (kx <= ky) break;
      int t = ids[j - 1];
      ids[j - 1] = ids[j];
      ids[j] = t;
    }
  int n = nj < c->nnodes ? nj : c->nnodes;
  int *owner = calloc((size_t)n, sizeof *owner);
  if (!owner) return false;
  for (int r = 0; r < n; r++) owner[r] = -1;
  for (int i = 0; i < nj; i++) a->m[ids[i]].rank = -1;
  owner[0] = 0;
  a->m[0].rank = 0;
  char text[400] = "";
  /* asked ranks first (a fixed layout), then previous ranks, then the lowest free */
  for (int pass = 0; pass < 3 && !text[0]; pass++) {
    for (int i = 1; i < n && !text[0]; i++) {
      member *m = &a->m[ids[i]];
      if (m->rank >= 0) continue;
      int want = pass == 0 ? m->asked : pass == 1 ? m->prev_rank : -1;
      if (pass == 2)
        for (int r = 1; r < n && want < 0; r++)
          if (owner[r] < 0) want = r;
      if (want < 0 || want >= n) continue;
      if (owner[want] >= 0) {
        if (pass == 0)
          snprintf(text, sizeof text, "two launchers (%s and %s) asked for --node_rank %d",
                   owner[want] ? a->m[owner[want]].addr : "node 0", m->addr, want);
        continue;
      }
      owner[want] = ids[i];
      m->rank = want;
    }
  }
  for (int i = 1; i < nj && !text[0]; i++) {
    const member *m = &a->m[ids[i]];
    if (m->rank >= 0 && m->nproc != a->n)
      snprintf(text, sizeof text, "node %d has --nproc_per_node %d but node 0 has %d: every node needs the same",
               m->rank, m->nproc, a->n);
  }
  free(owner);
  if (text[0]) {
    record_remote_failure(a, 2, KIND_ABORT, text);
    publish_failure(a, 2, KIND_ABORT, text);
    set_state(a, G_FAILED);
    return false;
  }
  size_t cap = 64 + (size_t)nj * 24 + strlen(a->run_id), used = 0;
  char *go = malloc(cap);
  if (!go) return false;
  used += (size_t)snprintf(go, cap, "%d %d", n, n);
  for (int i = 0; i < nj; i++)
    if (a->m[ids[i]].rank >= 0) used += (size_t)snprintf(go + used, cap - used, " %d:%d", ids[i], a->m[ids[i]].rank);
  snprintf(go + used, cap - used, " %s", a->run_id);
  char key[128];
  round_key(a, key, sizeof key, "go");
  kv_set(a, key, go);
  free(go);
  for (int i = n; i < nj; i++) {
    char name[300];
    member_name(a, ids[i], name, sizeof name);
    say("ctrain-launch: %s joined round %d, which is full (%d nodes): admitted at the next restart\n", name,
        a->round, c->nnodes);
  }
  a->node_rank = 0;
  a->nnodes = n;
  return true;
}

/* ------------------------------------------------------------------ rendezvous */

/* The round's failure key, if set: *kind and the text after the header. */
static bool read_failed(agent *a, int *code, int *kind, int *node, char *text, size_t cap, bool *err) {
  char key[128], val[700];
  bool found = false;
  *err = false;
  round_key(a, key, sizeof key, "failed");
  if (kv_peek(a, key, val, sizeof val, &found) != CT_OK) {
    *err = true;
    return false;
  }
  if (!found) return false;
  int off = 0;
  *code = 1, *kind = KIND_ABORT, *node = -1;
  sscanf(val, "%d %d %d %n", code, kind, node, &off);
  snprintf(text, cap, "%s", val + off);
  return true;
}

/* During rendezvous: a node that stopped (a signal, a timeout) aborts the round for every node;
 * true when it did, and this agent has failed with its text. *err: the store could not be read. */
static bool rdzv_aborted(agent *a, bool *err) {
  int code, kind, node;
  char text[700], t2[800];
  if (!read_failed(a, &code, &kind, &node, text, sizeof text, err)) return false;
  snprintf(t2, sizeof t2, "node %d: %s", node, text);
  record_remote_failure(a, code, KIND_ABORT, t2);
  set_state(a, G_FAILED);
  return true;
}

static void rdzv_timed_out(agent *a) {
  const ct_launch_config *c = a->cfg;
  int joined = 0;
  if (a->server) {
    for (int i = 0; i < a->nm; i++) joined += a->m[i].joined && !a->m[i].lost;
  } else {
    joined = a->joined;
  }
  char text[500], need[64] = "";
  if (elastic(a)) snprintf(need, sizeof need, "at least ");
  snprintf(text, sizeof text, "rendezvous timed out after %g s: %d of %s%d nodes joined round %d at %s:%d%s",
           c->rdzv_timeout, joined, need, c->min_nodes, a->round, a->store_host, a->port,
           a->server || a->client ? (a->server ? "" : " (no word from node 0)") : " (could not connect to node 0's store)");
  record_remote_failure(a, 1, KIND_ABORT, text);
  publish_failure(a, 1, KIND_ABORT, text);
  set_state(a, G_FAILED);
}

/* Node 0's side of INIT: true when the round is closed. */
static bool host_rendezvous(agent *a) {
  const ct_launch_config *c = a->cfg;
  bool err;
  if (rdzv_aborted(a, &err)) return false;
  host_scan(a);
  a->m[0].joined = true;
  int *ids = malloc((size_t)(a->nm + 1) * sizeof *ids), nj = 0;
  if (!ids) return false;
  ids[nj++] = 0;
  bool all = true;
  for (int id = 1; id < a->nm; id++) {
    member *m = &a->m[id];
    if (!m->known || m->lost || m->left) continue;
    char key[128], v[8];
    bool found;
    char what[32];
    snprintf(what, sizeof what, "in/%d", id);
    round_key(a, key, sizeof key, what);
    kv_peek(a, key, v, sizeof v, &found);
    m->joined = found;
    if (found) ids[nj++] = id;
    else all = false;
  }
  double now = ct_now();
  if (nj >= c->min_nodes && a->min_reached_at < 0) a->min_reached_at = now;
  bool close = nj >= c->nnodes;
  if (!close && nj >= c->min_nodes) {
    close = now >= a->min_reached_at + c->rdzv_last_call;
    if (a->round > 0 && all) close = true; /* every live launcher is in: nobody else is coming */
  }
  if (!close && now > a->rdzv_deadline) {
    free(ids);
    rdzv_timed_out(a);
    return false;
  }
  bool ok = close && host_close_round(a, ids, nj);
  free(ids);
  return ok;
}

/* The local address that reaches host:port (a UDP connect sends nothing) and its interface. */
static void route_to(const char *host, int port, char *addr, size_t acap, char *ifname, size_t icap) {
  addr[0] = ifname[0] = '\0';
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM}, *res = NULL;
  char ps[16];
  snprintf(ps, sizeof ps, "%d", port > 0 ? port : 9);
  if (getaddrinfo(host, ps, &hints, &res) != 0 || !res) return;
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in me;
  socklen_t ml = sizeof me;
  bool ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)&me, &ml) == 0;
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  if (!ok) return;
  inet_ntop(AF_INET, &me.sin_addr, addr, (socklen_t)acap);
  struct ifaddrs *ifs = NULL;
  if (getifaddrs(&ifs) != 0) return;
  for (struct ifaddrs *i = ifs; i; i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
        ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == me.sin_addr.s_addr) {
      snprintf(ifname, icap, "%s", i->ifa_name);
      break;
    }
  freeifaddrs(ifs);
}

/* Is `host` one of this machine's addresses? (binding to it succeeds only then) */
static bool is_local_address(const char *host) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
  if (getaddrinfo(host, NULL, &hints, &res) != 0) return false;
  bool local = false;
  for (struct addrinfo *r = res; r && !local; r = r->ai_next) {
    int fd = socket(r->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    local = bind(fd, r->ai_addr, r->ai_addrlen) == 0; /* port 0 from getaddrinfo(NULL service) */
    close(fd);
  }
  freeaddrinfo(res);
  return local;
}

/* The other nodes: connect, take a launcher id, say what we are. */
static bool client_connect(agent *a) {
  const ct_launch_config *c = a->cfg;
  double now = ct_now();
  if (now < a->connect_next) return false;
  double left = a->rdzv_deadline - now;
  if (ct_store_connect(a->store_host, a->port, a->token, left < 1 ? left : 1, &a->client) != CT_OK) {
    a->client = NULL;
    a->connect_next = ct_now() + 0.2;
    if (strstr(ct_last_error(), "wrong token")) {
      record_remote_failure(a, 1, KIND_ABORT, ct_last_error());
      set_state(a, G_FAILED);
    }
    return false;
  }
  ct_store_set_io_timeout(a->client, c->heartbeat_timeout);
  int64_t id = 0;
  char key[64], val[400], host[128] = "?";
  gethostname(host, sizeof host - 1);
  for (char *p = host; *p; p++)
    if (*p == ' ') *p = '_';
  snprintf(val, sizeof val, "%d %d %s %s", a->n, c->node_rank, a->my_addr[0] ? a->my_addr : "?", host);
  /* the id comes from the counter; node 0 ignores an id until its description is there */
  if (ct_store_add(a->client, "launch/nodes", 1, &id) != CT_OK) return false;
  a->id = (int)id;
  snprintf(key, sizeof key, "launch/node/%d", a->id);
  if (ct_store_set(a->client, key, val, strlen(val)) != CT_OK) return false;
  a->next_hb = 0;
  /* the round node 0 is forming now; if it already started, wait for the next one */
  bool found;
  char r[32];
  if (kv_peek(a, "launch/round", r, sizeof r, &found) != CT_OK) return false;
  a->round = found ? atoi(r) : 0;
  char gk[128];
  round_key(a, gk, sizeof gk, "go");
  if (kv_peek(a, gk, val, sizeof val, &found) != CT_OK) return false;
  if (found) {
    a->waiting = true;
    say("ctrain-launch: the group is running round %d without this node: waiting to be admitted at the next "
        "restart\n", a->round);
  }
  return true;
}

/* A node that is not in the running round: watch for the next one, or the end of the run. */
static bool client_wait_admission(agent *a) {
  char val[64];
  bool found;
  if (kv_peek(a, "launch/final", val, sizeof val, &found) != CT_OK) goto lost;
  if (found) {
    int code = atoi(val);
    say("ctrain-launch: the run ended (exit %d) before this node was admitted\n", code);
    if (code == 0) {
      set_state(a, G_SUCCEEDED);
    } else {
      char text[200];
      snprintf(text, sizeof text, "the run ended with exit %d before this node was admitted", code);
      record_remote_failure(a, code, KIND_ABORT, text);
      set_state(a, G_FAILED);
    }
    return false;
  }
  if (kv_peek(a, "launch/round", val, sizeof val, &found) != CT_OK) goto lost;
  if (found && atoi(val) > a->round) {
    a->round = atoi(val);
    a->waiting = false;
    a->joined = false;
    a->rdzv_deadline = ct_now() + a->cfg->rdzv_timeout;
  }
  return false;
lost:
  store_gone(a, " while waiting to be admitted");
  set_state(a, G_FAILED);
  return false;
}

/* INIT: returns true when the group may start. Single node: at once. */
static bool rendezvous(agent *a) {
  if (!multi(a)) {
    a->node_rank = 0;
    a->nnodes = 1;
    return true;
  }
  if (a->server) return host_rendezvous(a);
  double now = ct_now();
  if (a->waiting) return client_wait_admission(a);
  if (now > a->rdzv_deadline) {
    rdzv_timed_out(a);
    return false;
  }
  if (!a->client && !client_connect(a)) {
    if (a->client && a->state == G_INIT) { /* connected but registering failed */
      store_gone(a, " during rendezvous");
      set_state(a, G_FAILED);
    }
    return false;
  }
  if (a->waiting) return false;
  static char val[1 << 18]; /* "go" lists every node: ~10 bytes each */
  char key[128];
  bool found;
  if (!a->joined) {
    char what[32];
    snprintf(what, sizeof what, "in/%d", a->id);
    round_key(a, key, sizeof key, what);
    if (kv_set(a, key, "1") != CT_OK) goto lost;
    a->joined = true;
  }
  bool err;
  if (rdzv_aborted(a, &err)) return false;
  if (err) goto lost;
  round_key(a, key, sizeof key, "go");
  if (kv_peek(a, key, val, sizeof val, &found) != CT_OK) goto lost;
  if (!found) return false;
  /* "<nnodes> <count> <id>:<rank>... <run id>" */
  int nn = 0, cnt = 0, off = 0, rank = -1;
  sscanf(val, "%d %d %n", &nn, &cnt, &off);
  const char *p = val + off;
  for (int i = 0; i < cnt; i++) {
    int id = -1, r = -1, used = 0;
    if (sscanf(p, "%d:%d %n", &id, &r, &used) < 2) break;
    if (id == a->id) rank = r;
    p += used;
  }
  if (rank < 0) {
    a->waiting = true;
    say("ctrain-launch: round %d started with %d nodes without this one: waiting to be admitted at the next "
        "restart\n", a->round, nn);
    return false;
  }
  a->node_rank = rank;
  a->nnodes = nn;
  snprintf(a->run_id, sizeof a->run_id, "%s", p);
  return true;
lost:
  store_gone(a, " during rendezvous");
  set_state(a, G_FAILED);
  return false;
}

/* Monitor tick on a multi-node run: has another node failed, or were we declared lost? */
static void check_remote(agent *a) {
  if (!multi(a) || a->have_failure || a->store_lost) return;
  int code, kind, node;
  bool err;
  char text[700];
  if (read_failed(a, &code, &kind, &node, text, sizeof text, &err)) {
    char t2[800];
    if (kind == KIND_LOST) snprintf(t2, sizeof t2, "%s", text);
    else snprintf(t2, sizeof t2, "node %d reported a failure: %s", node, text);
    record_remote_failure(a, code, kind, t2);
    return;
  }
  if (err) store_gone(a, "");
}

/* The other nodes: were we declared lost (we stalled, or the link dropped for a while)? */
static void check_self_lost(agent *a) {
  if (a->server || !a->client || a->store_lost || a->id <= 0) return;
  char key[64], val[400];
  bool found;
  snprintf(key, sizeof key, "launch/lost/%d", a->id);
  if (kv_peek(a, key, val, sizeof val, &found) != CT_OK) {
    store_gone(a, "");
    return;
  }
  if (!found) return;
  char text[500];
  snprintf(text, sizeof text, "node 0 declared this node lost (%s)", val);
  a->store_lost = true; /* node 0 has written us off: no verdict will include us */
  if (!a->have_failure) record_remote_failure(a, 1, KIND_ABORT, text);
  a->restartable = false;
  snprintf(a->summary, sizeof a->summary, "%s", text);
}

/* Non-node-0 launchers: one heartbeat when due. */
static void heartbeat(agent *a) {
  if (a->server || !a->client || a->store_lost || a->id <= 0) return;
  if (a->state == G_SUCCEEDED || a->state == G_FAILED) return;
  double now = ct_now();
  if (now < a->next_hb) return;
  double every = a->cfg->heartbeat_timeout / 5;
  a->next_hb = now + (every < 0.1 ? 0.1 : every > 5 ? 5 : every);
  char key[64];
  snprintf(key, sizeof key, "launch/hb/%d", a->id);
  if (ct_store_add(a->client, key, 1, NULL) != CT_OK) store_gone(a, "");
}

/* HEALTHY with every local worker done and exited 0: has every node finished? */
static bool all_nodes_done(agent *a) {
  if (!multi(a)) return true;
  char key[128], val[64];
  bool found = false;
  if (!a->done_published) {
    round_key(a, key, sizeof key, "done");
    if (kv_add(a, key, 1, NULL) != CT_OK) {
      store_gone(a, "");
      return false;
    }
    a->done_published = true;
  }
  if (a->server) {
    round_key(a, key, sizeof key, "done");
    kv_peek(a, key, val, sizeof val, &found);
    if (!found || strtoll(val, NULL, 10) < a->nnodes) return false;
    round_key(a, key, sizeof key, "alldone");
    kv_set(a, key, "1");
    return true;
  }
  round_key(a, key, sizeof key, "alldone");
  if (kv_peek(a, key, val, sizeof val, &found) != CT_OK) {
    store_gone(a, "");
    return false;
  }
  return found;
}

/* ------------------------------------------------------------------ restarts */

/* Starts the next round (restart or membership change). */
static void next_round(agent *a, bool membership) {
  release_workers(a);
  a->round++;
  a->have_failure = false;
  a->fail_kind = KIND_WORKER;
  a->joined = a->done_published = a->acked = a->waiting = false;
  a->rdzv_deadline = ct_now() + a->cfg->rdzv_timeout;
  a->prev_world = a->world;
  a->prev_nnodes = a->nnodes;
  if (membership)
    say("ctrain-launch: membership change: re-forming the group (round %d; not counted against --max_restarts)%s\n",
        a->round, a->cfg->custom_cmd ? "" : " with train.resume=auto");
  else
    say("ctrain-launch: restarting the worker group (restart %d of %d)%s\n", a->restarts, a->cfg->max_restarts,
        a->cfg->custom_cmd ? "" : " with train.resume=auto");
  if (a->server) host_open_round(a);
  set_state(a, G_INIT);
}

/* Node 0, UNHEALTHY with its own workers gone: once every node of the round has stopped (or is
 * lost, or left), decide for everyone. Returns true when decided. */
static bool host_verdict(agent *a) {
  const ct_launch_config *c = a->cfg;
  host_scan(a);
  char key[128], val[16];
  bool found;
  if (a->fail_kind != KIND_ABORT && !a->signal_got && !a->preempted) {
    for (int id = 1; id < a->nm; id++) {
      member *m = &a->m[id];
      if (m->rank < 0 || m->lost || m->left) continue;
      char what[32];
      snprintf(what, sizeof what, "stopped/%d", id);
      round_key(a, key, sizeof key, what);
      kv_peek(a, key, val, sizeof val, &found);
      if (!found) return false;
    }
  }
  char verdict[700];
  bool restart = false, membership = false;
  int code = a->exit_code > 0 && a->exit_code < 256 ? a->exit_code : 1;
  if (a->lost_in_round) {
    /* the lost node is the cause; what the workers here did next is its consequence */
    snprintf(a->summary, sizeof a->summary, "%s", a->lost_text);
    code = 1;
    a->exit_code = 1;
  }
  int alive = alive_count(a);
  if (a->signal_got || a->preempted || a->fail_kind == KIND_ABORT) {
    restart = false;
  } else if (a->lost_in_round && elastic(a)) {
    membership = alive >= c->min_nodes;
    restart = membership;
    if (!restart)
      snprintf(a->summary + strlen(a->summary), sizeof a->summary - strlen(a->summary),
               "; %d node%s left, --nnodes %d:%d needs at least %d", alive, alive == 1 ? "" : "s", c->min_nodes,
               c->nnodes, c->min_nodes);
  } else {
    restart = a->restarts < c->max_restarts;
  }
  if (restart) {
    if (!membership) a->restarts++;
    snprintf(verdict, sizeof verdict, "restart %d %d", a->restarts, membership);
  } else {
    snprintf(verdict, sizeof verdict, "fail %d %s", code, a->summary);
  }
  round_key(a, key, sizeof key, "verdict");
  kv_set(a, key, verdict);
  if (restart) {
    next_round(a, membership);
  } else {
    a->restartable = false;
    set_state(a, G_FAILED);
  }
  return true;
}

/* The other nodes, UNHEALTHY with their workers gone: report it, then follow node 0. */
static void client_verdict(agent *a) {
  char key[128], val[800];
  bool found;
  if (!a->acked) {
    char what[32];
    snprintf(what, sizeof what, "stopped/%d", a->id);
    round_key(a, key, sizeof key, what);
    if (kv_set(a, key, "1") != CT_OK) goto lost;
    a->acked = true;
  }
  round_key(a, key, sizeof key, "verdict");
  if (kv_peek(a, key, val, sizeof val, &found) != CT_OK) goto lost;
  if (!found) return;
  int used = 0, membership = 0, code = 1, off = 0;
  if (sscanf(val, "restart %d %d", &used, &membership) == 2) {
    a->restarts = used;
    next_round(a, membership != 0);
    return;
  }
  sscanf(val, "fail %d %n", &code, &off);
  a->exit_code = code;
  if (a->fail_kind != KIND_WORKER || !a->summary[0] || strncmp(a->summary, "rank ", 5))
    snprintf(a->summary, sizeof a->summary, "%s", off ? val + off : val);
  a->restartable = false;
  set_state(a, G_FAILED);
  return;
lost:
  store_gone(a, " waiting for node 0's decision");
  set_state(a, G_FAILED);
}

/* ------------------------------------------------------------------ signals */

static void handle_signals(agent *a) {
  struct signalfd_siginfo si;
  while (read(a->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
    int sig = (int)si.ssi_signo;
    char sb[32];
    if (sig == SIGCHLD) continue; /* reaped below */
    if (sig == SIGUSR1) {
      a->preempted = true;
      say("ctrain-launch: got SIGUSR1: forwarding it (workers checkpoint and exit); no restarts after this\n");
      signal_all(a, SIGUSR1);
      continue;
    }
    /* SIGINT / SIGTERM / SIGHUP */
    if (a->signal_got) {
      say("ctrain-launch: got %s again: sending SIGKILL now\n", ct_signal_name(sig, sb, sizeof sb));
      signal_all(a, SIGKILL);
      a->stopping = true;
      a->killed = true;
      a->give_up_at = ct_now() + 10.0;
      continue;
    }
    a->signal_got = sig;
    say("ctrain-launch: got %s: forwarding it to the workers, SIGKILL after %g s\n",
        ct_signal_name(sig, sb, sizeof sb), a->cfg->grace_period);
    char text[128];
    snprintf(text, sizeof text, "the launcher on node %d got %s", a->node_rank, ct_signal_name(sig, sb, sizeof sb));
    publish_failure(a, 128 + sig, KIND_ABORT, text);
    if (a->state == G_FAILED || a->state == G_SUCCEEDED) continue;
    begin_stop(a, sig);
    set_state(a, G_STOPPED);
  }
}

/* ------------------------------------------------------------------ the state machine */

static void advance(agent *a) {
  switch (a->state) {
    case G_INIT: {
      if (!rendezvous(a)) return;
      a->world = a->n * a->nnodes;
      if (a->prev_world && a->prev_world != a->world)
        say("ctrain-launch: world size %d -> %d (%d -> %d nodes)\n", a->prev_world, a->world, a->prev_nnodes,
            a->nnodes);
      if (a->round == 0 || multi(a)) {
        say("ctrain-launch: starting %d worker%s on node %d of %d (world size %d), store %s:%d, run id %s\n", a->n,
            a->n == 1 ? "" : "s", a->node_rank, a->nnodes, a->world, a->store_host, a->port, a->run_id);
      }
      if (spawn_all(a) != CT_OK) {
        char text[600];
        snprintf(text, sizeof text, "could not start the workers: %s", ct_last_error());
        say("ctrain-launch: %s\n", text);
        record_remote_failure(a, 1, KIND_ABORT, text);
        publish_failure(a, 1, KIND_ABORT, text);
        begin_stop(a, SIGTERM);
        set_state(a, G_UNHEALTHY);
        return;
      }
      set_state(a, G_HEALTHY);
      return;
    }
    case G_HEALTHY: {
      for (int i = 0; i < a->n; i++) {
        ct_worker *w = &a->w[i];
        if (!w->running && !a->have_failure && !(WIFEXITED(w->wait_status) && WEXITSTATUS(w->wait_status) == 0)) {
          record_local_failure(a, w);
          break;
        }
      }
      if (a->have_failure) {
        begin_stop(a, SIGTERM);
        set_state(a, G_UNHEALTHY);
        return;
      }
      bool leaders_done = true;
      for (int i = 0; i < a->n; i++) leaders_done &= !a->w[i].running;
      if (!leaders_done) return;
      /* every worker exited 0: clear out anything they left in their process groups */
      if (a->stopping || group_running(a)) {
        if (!a->stopping) begin_stop(a, SIGTERM);
        if (!stop_progress(a)) return;
      }
      if (!all_nodes_done(a)) {
        if (a->have_failure) set_state(a, G_UNHEALTHY); /* another node failed while we were done */
        return;
      }
      set_state(a, G_SUCCEEDED);
      return;
    }
    case G_UNHEALTHY:
      if (group_running(a) || a->stopping) {
        if (!a->stopping) begin_stop(a, SIGTERM);
        if (!stop_progress(a)) return;
      }
      if (!multi(a)) {
        if (restart_left(a)) {
          a->restarts++;
          next_round(a, false);
        } else {
          set_state(a, G_FAILED);
        }
      } else if (a->server) {
        host_verdict(a);
      } else if (a->store_lost || a->fail_kind == KIND_ABORT || a->signal_got || a->preempted) {
        set_state(a, G_FAILED);
      } else {
        client_verdict(a);
      }
      return;
    case G_STOPPED:
      if (group_running(a) || a->stopping) {
        if (!a->stopping) begin_stop(a, a->signal_got ? a->signal_got : SIGTERM);
        stop_progress(a);
      }
      return;
    case G_SUCCEEDED:
    case G_FAILED:
      return;
  }
}

static bool finished(agent *a) {
  if (a->state == G_SUCCEEDED || a->state == G_FAILED) return !group_running(a) && !a->stopping;
  if (a->state == G_STOPPED) return !group_running(a) && !a->stopping;
  return false;
}

/* ------------------------------------------------------------------ the loop */

static ct_status setup_signals(agent *a) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  sigaddset(&set, SIGUSR1);
  sigaddset(&set, SIGCHLD);
  if (sigprocmask(SIG_BLOCK, &set, NULL) != 0) return ct_set_error(CT_ERR_RUNTIME, "sigprocmask: %s", strerror(errno));
  a->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  if (a->sigfd < 0) return ct_set_error(CT_ERR_RUNTIME, "signalfd: %s", strerror(errno));
  /* Inherited dispositions: SIGCHLD ignored would make the kernel auto-reap our workers (and
   * waitpid lose their exit status); a script's `cmd &` ignores SIGINT. Blocked signals reach
   * the signalfd either way, but restore the defaults so that nothing depends on that (safe:
   * they are blocked). A SIGHUP ignored on purpose (nohup) stays ignored. */
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  signal(SIGUSR1, SIG_DFL);
  signal(SIGCHLD, SIG_DFL);
  signal(SIGPIPE, SIG_IGN); /* a closed console or store socket is an error return, not death */
  /* Orphans of our workers (their own children) are reparented to us, so we can reap them and
   * see through kill(-pgid, 0) whether a worker's process group is really gone. */
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  return CT_OK;
}

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

/* Token and run id: random on one node; agreed on several (see the usage text). */
static ct_status make_identity(agent *a) {
  const ct_launch_config *c = a->cfg;
  const char *env_tok = getenv("CTRAIN_STORE_TOKEN");
  if (env_tok && env_tok[0]) {
    snprintf(a->token, sizeof a->token, "%s", env_tok);
  } else if (!multi(a)) {
    CT_TRY(ct_store_make_token(a->token));
  } else {
    /* Not secret: every node must compute it without talking to the others first. Set
     * CTRAIN_STORE_TOKEN on every node when the network is not trusted. */
    char seed[600];
    if (elastic(a))
      snprintf(seed, sizeof seed, "ctrain-launch:%s:%s:%d:%d:%d", c->run_id, c->master_addr, c->master_port,
               c->min_nodes, c->nnodes);
    else
      snprintf(seed, sizeof seed, "ctrain-launch:%s:%s:%d:%d", c->run_id, c->master_addr, c->master_port, c->nnodes);
    uint64_t x = ct_mix64(hash_str(seed)), y = ct_mix64(x ^ 0x2545F4914F6CDD1Dull);
    snprintf(a->token, sizeof a->token, "%016" PRIx64 "%016" PRIx64, x, y);
  }
  if (c->run_id[0]) {
    snprintf(a->run_id, sizeof a->run_id, "%s", c->run_id);
  } else {
    char t[CT_STORE_TOKEN_LEN + 1];
    CT_TRY(ct_store_make_token(t));
    snprintf(a->run_id, sizeof a->run_id, "%.12s", t); /* nodes != 0 take node 0's from "go" */
  }
  return CT_OK;
}

/* Multi-node: which interface reaches node 0, and what the workers get for it. */
static void setup_interfaces(agent *a) {
  const ct_launch_config *c = a->cfg;
  route_to(c->master_addr, c->master_port, a->my_addr, sizeof a->my_addr, a->ifname, sizeof a->ifname);
  if (c->socket_ifname[0]) {
    add_extra(a, "NCCL_SOCKET_IFNAME", c->socket_ifname);
    add_extra(a, "CTRAIN_SOCKET_IFNAME", c->socket_ifname);
    say("ctrain-launch: workers use interface %s (--socket_ifname) for NCCL and Gloo\n", c->socket_ifname);
  } else if (getenv("NCCL_SOCKET_IFNAME") && getenv("NCCL_SOCKET_IFNAME")[0]) {
    /* passed through as it is */
  } else if (a->ifname[0]) {
    add_extra(a, "NCCL_SOCKET_IFNAME", a->ifname);
  }
}

/* Elastic runs of ctrain train: the config's train.grad_accum, to keep the global batch. */
static void read_grad_accum(agent *a) {
  const ct_launch_config *c = a->cfg;
  if (!elastic(a) || c->custom_cmd || !c->keep_global_batch || c->nargs < 1) return;
  ct_config *cc = calloc(1, sizeof *cc);
  if (!cc) return;
  if (ct_config_load(c->args[0], c->nargs - 1, c->args + 1, cc) == CT_OK) {
    a->grad_accum0 = cc->train.grad_accum;
  } else {
    say("ctrain-launch: note: cannot read %s to keep the global batch (%s); train.grad_accum stays as it is\n",
        c->args[0], ct_last_error());
    ct_clear_error();
  }
  free(cc);
}

/* Node 0's store: --node_rank 0, or --node_rank left out on the machine that has --master_addr.
 * Returns false after reporting an error (*code set). */
static bool start_store(agent *a, int *code) {
  const ct_launch_config *c = a->cfg;
  bool want = c->node_rank == 0;
  if (c->node_rank < 0) want = is_local_address(c->master_addr);
  if (!want) return true;
  /* one node: listen where the workers connect; several: on every interface */
  const char *bind_host = multi(a) ? NULL : c->master_addr;
  ct_status st = ct_store_server_start(bind_host, c->master_port, a->token, &a->server, &a->port);
  if (st == CT_OK) {
    a->host = true;
    a->id = 0;
    a->node_rank = 0;
    return true;
  }
  if (c->node_rank < 0 && st == CT_ERR_USAGE && strstr(ct_last_error(), "already in use")) {
    /* another launcher on this machine hosts it: join as a client */
    ct_clear_error();
    return true;
  }
  say("ctrain-launch: error: %s\n", ct_last_error());
  *code = ct_status_exit_code(st);
  return false;
}

int ct_agent_run(const ct_launch_config *cfg) {
  agent a = {.cfg = cfg, .state = G_INIT, .sigfd = -1, .id = -1, .node_rank = cfg->node_rank,
             .fail_kind = KIND_WORKER, .min_reached_at = -1};
  a.n = cfg->nproc_per_node;
  a.nnodes = cfg->nnodes;
  a.world = cfg->nproc_per_node * cfg->nnodes;
  snprintf(a.store_host, sizeof a.store_host, "%s", cfg->master_addr);
  a.port = cfg->master_port;
  int code = 1;
  ct_status st;
  if ((st = setup_signals(&a)) != CT_OK || (st = make_identity(&a)) != CT_OK) {
    say("ctrain-launch: error: %s\n", ct_last_error());
    return ct_status_exit_code(st);
  }
  if (cfg->log_dir[0] && (st = ct_mkdirs(cfg->log_dir)) != CT_OK) {
    say("ctrain-launch: error: --log_dir %s: %s\n", cfg->log_dir, ct_last_error());
    return 2;
  }
  if (multi(&a)) setup_interfaces(&a);
  if (!start_store(&a, &code)) return code;
  read_grad_accum(&a);
  a.w = calloc((size_t)a.n, sizeof *a.w);
  if (!a.w || (a.server && multi(&a) && !member_at(&a, 0))) {
    say("ctrain-launch: error: out of memory\n");
    free(a.w);
    ct_store_server_stop(a.server);
    return 1;
  }
  if (a.server && multi(&a)) {
    member *m0 = &a.m[0];
    m0->known = true;
    m0->nproc = a.n;
    m0->asked = 0;
    snprintf(m0->addr, sizeof m0->addr, "%s", a.my_addr[0] ? a.my_addr : cfg->master_addr);
    gethostname(m0->host, sizeof m0->host - 1);
    host_open_round(&a);
  }
  for (int i = 0; i < a.n; i++) {
    a.w[i].local_rank = i;
    a.w[i].rank = (a.node_rank > 0 ? a.node_rank : 0) * a.n + i;
    a.w[i].show = cfg->tee && (!cfg->show_local || cfg->show_local[i]);
    a.w[i].out_fd = a.w[i].err_fd = a.w[i].log_fd = -1;
  }
  a.rdzv_deadline = ct_now() + cfg->rdzv_timeout;
  a.next_tick = ct_now();

  struct pollfd *fds = NULL;
  int *owner = NULL; /* per pollfd: worker index, -1 signalfd, -2 store */
  int cap = 0;
  double linger_until = -1;
  for (;;) {
    advance(&a);
    if (finished(&a)) {
      /* node 0 of a multi-node run keeps serving until the other launchers have read the outcome */
      if (!(multi(&a) && a.server)) break;
      if (linger_until < 0) {
        linger_until = ct_now() + (cfg->monitor_interval * 4 > 5 ? cfg->monitor_interval * 4 : 5);
        int fc = a.state == G_SUCCEEDED ? 0 : a.state == G_STOPPED ? 128 + a.signal_got
                                                                  : (a.exit_code > 0 && a.exit_code < 256 ? a.exit_code : 1);
        if (a.state != G_SUCCEEDED) {
          char text[600], key[128], v[8];
          bool found;
          snprintf(text, sizeof text, "%s", a.summary[0] ? a.summary : "node 0 stopped");
          publish_failure(&a, fc, KIND_ABORT, text);
          round_key(&a, key, sizeof key, "verdict");
          kv_peek(&a, key, v, sizeof v, &found);
          if (!found) {
            char verdict[700];
            snprintf(verdict, sizeof verdict, "fail %d %s", fc, text);
            kv_set(&a, key, verdict);
          }
        }
        char fv[16];
        snprintf(fv, sizeof fv, "%d", fc);
        kv_set(&a, "launch/final", fv);
      }
      /* wait for every live launcher to say bye (a lost one cannot) */
      host_scan(&a);
      if (alive_count(&a) <= 1 || ct_now() > linger_until) break;
    }
    int need = 1 + 2 * a.n + (a.server ? ct_store_server_nfds(a.server) : 0);
    if (need > cap) {
      cap = need * 2;
      fds = realloc(fds, (size_t)cap * sizeof *fds);
      owner = realloc(owner, (size_t)cap * sizeof *owner);
      if (!fds || !owner) { say("ctrain-launch: error: out of memory\n"); break; }
    }
    int n = 0;
    fds[n] = (struct pollfd){.fd = a.sigfd, .events = POLLIN};
    owner[n++] = -1;
    for (int i = 0; i < a.n; i++) {
      if (a.w[i].out_fd >= 0) { fds[n] = (struct pollfd){.fd = a.w[i].out_fd, .events = POLLIN}; owner[n++] = i; }
      if (a.w[i].err_fd >= 0) { fds[n] = (struct pollfd){.fd = a.w[i].err_fd, .events = POLLIN}; owner[n++] = i; }
    }
    int store_at = n;
    if (a.server) {
      int m = ct_store_server_poll_fds(a.server, fds + n, cap - n);
      for (int i = 0; i < m; i++) owner[n + i] = -2;
      n += m;
    }
    double now = ct_now(), wait_s = a.next_tick - now;
    if (a.stopping) {
      double d = (a.killed ? a.give_up_at : a.kill_at) - now;
      if (d < wait_s) wait_s = d;
      if (wait_s > 0.05) wait_s = 0.05; /* a stop in progress polls its process groups */
    }
    if (multi(&a) && (a.state == G_INIT || a.state == G_UNHEALTHY) && !a.waiting && wait_s > 0.05) wait_s = 0.05;
    if (a.client && !a.store_lost && a.next_hb - now < wait_s) wait_s = a.next_hb - now;
    if (linger_until >= 0 && wait_s > 0.05) wait_s = 0.05;
    int tmo = wait_s <= 0 ? 0 : (int)(wait_s * 1000) + 1;
    if (a.server) {
      int st_ms = ct_store_server_timeout_ms(a.server);
      if (st_ms >= 0 && st_ms < tmo) tmo = st_ms;
    }
    int r = poll(fds, (nfds_t)n, tmo);
    if (r < 0 && errno != EINTR) {
      say("ctrain-launch: error: poll: %s\n", strerror(errno));
      break;
    }
    if (r > 0) {
      if (fds[0].revents) handle_signals(&a);
      for (int i = 1; i < store_at; i++)
        if (fds[i].revents) ct_worker_read(&a.w[owner[i]], fds[i].fd);
      if (a.server && ct_store_server_handle(a.server, fds + store_at, n - store_at) != CT_OK)
        say("ctrain-launch: warning: %s\n", ct_last_error());
    }
    reap(&a);
    heartbeat(&a);
    if (ct_now() >= a.next_tick) {
      a.next_tick = ct_now() + cfg->monitor_interval;
      for (int i = 0; i < a.n; i++)
        if (!a.w[i].running) ct_worker_check_group(&a.w[i]);
      if (a.server && multi(&a) && a.state != G_INIT) host_scan(&a);
      if (a.state == G_HEALTHY) check_remote(&a);
      if (a.state != G_SUCCEEDED && a.state != G_FAILED) check_self_lost(&a);
    }
  }

  /* outcome */
  char sb[32];
  if (a.state == G_SUCCEEDED) {
    code = 0;
    if (a.preempted) say("ctrain-launch: workers exited after SIGUSR1: done\n");
  } else if (a.state == G_STOPPED) {
    code = 128 + a.signal_got;
    say("ctrain-launch: stopped by %s; exiting with %d\n", ct_signal_name(a.signal_got, sb, sizeof sb), code);
  } else {
    code = a.have_failure ? a.exit_code : 1;
    if (code <= 0 || code > 255) code = 1;
    say("ctrain-launch: failed%s: %s; exiting with %d\n",
        a.restarts ? " after restarts" : "", a.summary[0] ? a.summary : "see above", code);
  }
  if (multi(&a) && a.client && !a.said_bye && !a.store_lost && a.id > 0) {
    char key[64];
    snprintf(key, sizeof key, "launch/bye/%d", a.id);
    if (ct_store_set(a.client, key, "1", 1) != CT_OK) ct_clear_error();
    a.said_bye = true;
  }
  release_workers(&a);
  reap(&a);
  free(fds);
  free(owner);
  free(a.w);
  free(a.m);
  ct_store_close(a.client);
  ct_store_server_stop(a.server);
  close(a.sigfd);
  return code;
}

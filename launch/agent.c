/* launch/agent.c — the ctrain-launch agent: one worker group per node, driven by an event loop.
 *
 * The loop (redis `ae` style) polls a signalfd (SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGCHLD are
 * blocked and read from it, so no work happens in a signal handler), every worker's stdout and
 * stderr pipes, and on node 0 the store's sockets; it wakes for the monitor timer, the grace
 * deadline and the store's parked-request deadlines. Children are reaped with
 * waitpid(-1, WNOHANG) on every turn; the launcher is a child subreaper, so anything a worker
 * leaves behind is reparented to it and reaped too: no zombies.
 *
 * Worker group states (torchrun's WorkerState):
 *   INIT       rendezvous (multi-node: every node's launcher checks in through the store),
 *              then spawn                                                  -> HEALTHY
 *   HEALTHY    workers running. All exit 0 (on every node)                  -> SUCCEEDED
 *              one fails, or another node reports a failure: stop the rest -> UNHEALTHY
 *   UNHEALTHY  stopping (SIGTERM, grace period, SIGKILL); when all are gone: restart budget
 *              left -> INIT with CTRAIN_RESTART_COUNT + 1, else              -> FAILED
 *   STOPPED    the launcher got SIGINT/SIGTERM/SIGHUP: forwarded, then stop as above, exit
 *              128 + signal.
 *
 * Multi-node (fixed --nnodes) keys, per round r (= restart count), on node 0's store:
 *   launch/r/join (counter), launch/r/nproc/<node>, launch/r/go (value: run id, set by node 0
 *   when all joined), launch/r/failed ("<code> <restartable> <node> <text>", set by the node that
 *   saw the failure first), launch/r/done (counter of nodes whose workers all exited 0),
 *   launch/r/alldone (set by node 0), launch/bye (counter: non-zero nodes that are exiting, so
 *   node 0 keeps the store up until they have read the outcome).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "launch/launch.h"
#include "parallel/store.h"

extern char **environ;

typedef enum { G_INIT, G_HEALTHY, G_UNHEALTHY, G_SUCCEEDED, G_FAILED, G_STOPPED } group_state;

static const char *const STATE_NAMES[] = {"INIT", "HEALTHY", "UNHEALTHY", "SUCCEEDED", "FAILED", "STOPPED"};

typedef struct agent {
  const ct_launch_config *cfg;
  group_state state;
  int restarts; /* restarts done: the CTRAIN_RESTART_COUNT of the current group */
  int n;        /* workers on this node */
  ct_worker *w;
  int world;
  /* rendezvous */
  ct_store_server *server; /* node 0 */
  ct_store *client;        /* other nodes */
  char store_host[256];
  int port;
  char token[128];
  char run_id[128];
  bool joined, done_published, said_bye;
  double rdzv_deadline, connect_next;
  /* stopping */
  bool stopping, killed;
  double kill_at, give_up_at;
  /* outcome */
  bool have_failure, restartable;
  int exit_code;
  char summary[512]; /* one line: what failed */
  int signal_got;    /* SIGINT/SIGTERM/SIGHUP received */
  bool preempted;    /* SIGUSR1 received: no restarts */
  int sigfd;
  double next_tick;
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

/* ------------------------------------------------------------------ store access */
/* Node 0 reads and writes its own server's table directly (it cannot be a blocking client of
 * its own loop); the other nodes use a client. The client calls are quick round trips. */

static ct_status kv_set(agent *a, const char *key, const char *val) {
  if (a->server) return ct_store_server_local_set(a->server, key, val, strlen(val));
  return ct_store_set(a->client, key, val, strlen(val));
}

static ct_status kv_add(agent *a, const char *key, int64_t delta, int64_t *out) {
  if (a->server) return ct_store_server_local_add(a->server, key, delta, out);
  return ct_store_add(a->client, key, delta, out);
}

/* Non-blocking read: *found false when the key is absent. */
static ct_status kv_peek(agent *a, const char *key, char *out, size_t cap, bool *found) {
  out[0] = '\0';
  if (a->server) {
    const void *v;
    size_t len;
    CT_TRY(ct_store_server_local_get(a->server, key, &v, &len, found));
    if (*found) snprintf(out, cap, "%.*s", (int)len, (const char *)v);
    return CT_OK;
  }
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
  snprintf(buf, cap, "launch/%d/%s", a->restarts, what);
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

/* Records the group's first failure and reports it in one block. */
static void record_local_failure(agent *a, ct_worker *w) {
  char what[128], sb[32];
  int code = describe_status(w->wait_status, what, sizeof what);
  ct_worker_drain(w);
  a->have_failure = true;
  a->restartable = true;
  a->exit_code = code;
  snprintf(a->summary, sizeof a->summary, "rank %d (local_rank %d on node %d) %s", w->rank, w->local_rank,
           a->cfg->node_rank, what);
  char block[12288];
  int n = snprintf(block, sizeof block,
                   "ctrain-launch: worker failure: rank %d (local_rank %d on node %d, pid %d) %s\n",
                   w->rank, w->local_rank, a->cfg->node_rank, (int)w->pid, what);
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
             restart_left(a) ? "; the group will restart" : "");
  say("%s", block);
  if (multi(a)) {
    char key[128], val[700];
    round_key(a, key, sizeof key, "failed");
    snprintf(val, sizeof val, "%d 1 %d %s", code, a->cfg->node_rank, a->summary);
    if (kv_set(a, key, val) != CT_OK)
      say("ctrain-launch: warning: could not tell the other nodes: %s\n", ct_last_error());
  }
}

/* Another node's failure (or a lost store): stop ours too. */
static void record_remote_failure(agent *a, int code, bool restartable, const char *text) {
  if (a->have_failure) return;
  a->have_failure = true;
  a->restartable = restartable;
  a->exit_code = code;
  snprintf(a->summary, sizeof a->summary, "%s", text);
  say("ctrain-launch: %s; stopping the workers on node %d\n", text, a->cfg->node_rank);
}

static void publish_abort(agent *a, int code, const char *text) {
  if (!multi(a) || (!a->server && !a->client)) return;
  char key[128], val[700];
  round_key(a, key, sizeof key, "failed");
  snprintf(val, sizeof val, "%d 0 %d %s", code, a->cfg->node_rank, text);
  if (kv_set(a, key, val) != CT_OK) ct_clear_error();
}

/* NULL-terminated environment for one worker: ours, minus the variables we set, plus them. */
static char **worker_env(const agent *a, const ct_worker *w) {
  static const char *const OURS[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                     "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                     "CTRAIN_RESTART_COUNT", "CTRAIN_MAX_RESTARTS", "CTRAIN_RUN_ID",
                                     "CTRAIN_STORE_TOKEN", NULL};
  size_t n = 0;
  while (environ[n]) n++;
  char **env = calloc(n + 20, sizeof *env);
  if (!env) return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    bool ours = false;
    for (int j = 0; OURS[j] && !ours; j++) {
      size_t l = strlen(OURS[j]);
      ours = !strncmp(environ[i], OURS[j], l) && environ[i][l] == '=';
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
  ADD("GROUP_RANK=%d", c->node_rank);
  ADD("ROLE_RANK=%d", w->rank);
  ADD("ROLE_WORLD_SIZE=%d", a->world);
  ADD("MASTER_ADDR=%s", a->store_host);
  ADD("MASTER_PORT=%d", a->port);
  ADD("CTRAIN_RESTART_COUNT=%d", a->restarts);
  ADD("CTRAIN_MAX_RESTARTS=%d", c->max_restarts);
  ADD("CTRAIN_RUN_ID=%s", a->run_id);
  ADD("CTRAIN_STORE_TOKEN=%s", a->token);
  if (a->n > 1 && !getenv("OMP_NUM_THREADS")) ADD("OMP_NUM_THREADS=1");
#undef ADD
  env[k] = NULL;
  return env;
}

static void free_strv(char **v) {
  if (!v) return;
  for (size_t i = 0; v[i]; i++) free(v[i]);
  free(v);
}

static ct_status spawn_all(agent *a) {
  const ct_launch_config *c = a->cfg;
  /* argv: ctrain train ARGS... [train.resume=auto], or PROGRAM ARGS... with --cmd */
  char **argv = calloc((size_t)c->nargs + 4, sizeof *argv);
  if (!argv) return ct_set_error(CT_ERR_NOMEM, "out of memory");
  int k = 0;
  argv[k++] = (char *)c->program;
  if (!c->custom_cmd) argv[k++] = "train";
  for (int i = 0; i < c->nargs; i++) argv[k++] = c->args[i];
  /* a restarted group resumes from ckpt/latest (a later key=value wins over the user's) */
  if (!c->custom_cmd && a->restarts > 0) argv[k++] = "train.resume=auto";
  argv[k] = NULL;
  ct_status st = CT_OK;
  for (int i = 0; i < a->n && st == CT_OK; i++) {
    ct_worker *w = &a->w[i];
    char **env = worker_env(a, w);
    if (!env) { st = ct_set_error(CT_ERR_NOMEM, "out of memory"); break; }
    st = ct_worker_spawn(w, argv, env, c->log_dir, a->restarts);
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

/* ------------------------------------------------------------------ rendezvous */

/* INIT: returns true when the group may start. Single node: at once. */
static bool rendezvous(agent *a) {
  if (!multi(a)) return true;
  const ct_launch_config *c = a->cfg;
  double now = ct_now();
  if (now > a->rdzv_deadline) {
    char key[128], v[64] = "";
    bool found = false;
    round_key(a, key, sizeof key, "join");
    if (a->server || a->client) kv_peek(a, key, v, sizeof v, &found);
    char text[400];
    snprintf(text, sizeof text, "rendezvous timed out after %g s: %s of %d nodes joined round %d at %s:%d%s",
             c->rdzv_timeout, found ? v : "0", c->nnodes, a->restarts, a->store_host, a->port,
             a->server || a->client ? "" : " (could not connect to node 0's store)");
    record_remote_failure(a, 1, false, text);
    set_state(a, G_FAILED);
    return false;
  }
  if (!a->server && !a->client) {
    if (now < a->connect_next) return false;
    double left = a->rdzv_deadline - now;
    if (ct_store_connect(a->store_host, a->port, a->token, left < 1 ? left : 1, &a->client) != CT_OK) {
      a->client = NULL;
      a->connect_next = ct_now() + 0.2;
      if (strstr(ct_last_error(), "wrong token")) {
        record_remote_failure(a, 1, false, ct_last_error());
        set_state(a, G_FAILED);
      }
      return false;
    }
  }
  char key[128], val[256];
  bool found;
  if (!a->joined) {
    char v[32];
    snprintf(v, sizeof v, "%d", a->n);
    char nk[64];
    snprintf(nk, sizeof nk, "nproc/%d", c->node_rank);
    round_key(a, key, sizeof key, nk);
    if (kv_set(a, key, v) != CT_OK) goto lost;
    round_key(a, key, sizeof key, "join");
    if (kv_add(a, key, 1, NULL) != CT_OK) goto lost;
    a->joined = true;
  }
  /* a node that stopped during rendezvous (signal) aborts the round for everyone */
  round_key(a, key, sizeof key, "failed");
  if (kv_peek(a, key, val, sizeof val, &found) != CT_OK) goto lost;
  if (found) {
    int code = 1, restartable = 0, node = -1, off = 0;
    sscanf(val, "%d %d %d %n", &code, &restartable, &node, &off);
    char text[400];
    snprintf(text, sizeof text, "node %d: %s", node, val + off);
    record_remote_failure(a, code, false, text);
    set_state(a, G_FAILED);
    return false;
  }
  if (a->server) {
    int64_t joined = 0;
    round_key(a, key, sizeof key, "join");
    if (kv_peek(a, key, val, sizeof val, &found) != CT_OK) goto lost;
    joined = found ? strtoll(val, NULL, 10) : 0;
    if (joined < c->nnodes) return false;
    for (int node = 0; node < c->nnodes; node++) {
      char nk[64];
      snprintf(nk, sizeof nk, "nproc/%d", node);
      round_key(a, key, sizeof key, nk);
      kv_peek(a, key, val, sizeof val, &found);
      if (!found || atoi(val) != a->n) {
        char text[300];
        snprintf(text, sizeof text, "node %d has --nproc_per_node %s but node 0 has %d: every node needs the same",
                 node, found ? val : "?", a->n);
        record_remote_failure(a, 2, false, text);
        publish_abort(a, 2, text);
        set_state(a, G_FAILED);
        return false;
      }
    }
    round_key(a, key, sizeof key, "go");
    if (kv_set(a, key, a->run_id) != CT_OK) goto lost;
    return true;
  }
  round_key(a, key, sizeof key, "go");
  if (kv_peek(a, key, val, sizeof val, &found) != CT_OK) goto lost;
  if (!found) return false;
  snprintf(a->run_id, sizeof a->run_id, "%s", val);
  return true;
lost: {
  char text[600];
  snprintf(text, sizeof text, "lost the store at %s:%d during rendezvous: %s", a->store_host, a->port,
           ct_last_error());
  record_remote_failure(a, 1, false, text);
  set_state(a, G_FAILED);
  return false;
}
}

/* Monitor tick on a multi-node run: has another node failed? */
static void check_remote(agent *a) {
  if (!multi(a) || a->have_failure) return;
  char key[128], val[700];
  bool found;
  round_key(a, key, sizeof key, "failed");
  if (kv_peek(a, key, val, sizeof val, &found) != CT_OK) {
    char text[600];
    snprintf(text, sizeof text, "lost the store at %s:%d (node 0's launcher gone?): %s", a->store_host, a->port,
             ct_last_error());
    record_remote_failure(a, 1, false, text);
    return;
  }
  if (!found) return;
  int code = 1, restartable = 0, node = -1, off = 0;
  sscanf(val, "%d %d %d %n", &code, &restartable, &node, &off);
  char text[800];
  snprintf(text, sizeof text, "node %d reported a failure: %s", node, val + off);
  record_remote_failure(a, code, restartable != 0, text);
}

/* HEALTHY with every local worker done and exited 0: has every node finished? */
static bool all_nodes_done(agent *a) {
  if (!multi(a)) return true;
  char key[128], val[64];
  bool found = false;
  if (!a->done_published) {
    round_key(a, key, sizeof key, "done");
    if (kv_add(a, key, 1, NULL) != CT_OK) return false;
    a->done_published = true;
  }
  if (a->server) {
    round_key(a, key, sizeof key, "done");
    kv_peek(a, key, val, sizeof val, &found);
    if (!found || strtoll(val, NULL, 10) < a->cfg->nnodes) return false;
    round_key(a, key, sizeof key, "alldone");
    kv_set(a, key, "1");
    return true;
  }
  round_key(a, key, sizeof key, "alldone");
  if (kv_peek(a, key, val, sizeof val, &found) != CT_OK) {
    check_remote(a); /* turns a lost store into a failure */
    return false;
  }
  return found;
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
    snprintf(text, sizeof text, "the launcher on node %d got %s", a->cfg->node_rank, ct_signal_name(sig, sb, sizeof sb));
    publish_abort(a, 128 + sig, text);
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
      if (a->restarts == 0 || multi(a)) {
        say("ctrain-launch: starting %d worker%s on node %d of %d (world size %d), store %s:%d, run id %s%s\n", a->n,
            a->n == 1 ? "" : "s", a->cfg->node_rank, a->cfg->nnodes, a->world, a->store_host, a->port, a->run_id,
            a->restarts ? "" : "");
      }
      if (spawn_all(a) != CT_OK) {
        char text[600];
        snprintf(text, sizeof text, "could not start the workers: %s", ct_last_error());
        say("ctrain-launch: %s\n", text);
        record_remote_failure(a, 1, false, text);
        publish_abort(a, 1, text);
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
        if (a->have_failure) { /* another node failed while we were done */
          set_state(a, G_UNHEALTHY);
        }
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
      if (restart_left(a)) {
        release_workers(a);
        a->restarts++;
        a->have_failure = false;
        a->joined = a->done_published = false;
        a->rdzv_deadline = ct_now() + a->cfg->rdzv_timeout;
        say("ctrain-launch: restarting the worker group (restart %d of %d)%s\n", a->restarts, a->cfg->max_restarts,
            a->cfg->custom_cmd ? "" : " with train.resume=auto");
        set_state(a, G_INIT);
      } else {
        set_state(a, G_FAILED);
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

int ct_agent_run(const ct_launch_config *cfg) {
  agent a = {.cfg = cfg, .state = G_INIT, .sigfd = -1};
  a.n = cfg->nproc_per_node;
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
  if (cfg->node_rank == 0) {
    /* one node: listen where the workers connect; several: on every interface */
    const char *bind_host = multi(&a) ? NULL : cfg->master_addr;
    st = ct_store_server_start(bind_host, cfg->master_port, a.token, &a.server, &a.port);
    if (st != CT_OK) {
      say("ctrain-launch: error: %s\n", ct_last_error());
      return ct_status_exit_code(st);
    }
  }
  a.w = calloc((size_t)a.n, sizeof *a.w);
  if (!a.w) {
    say("ctrain-launch: error: out of memory\n");
    ct_store_server_stop(a.server);
    return 1;
  }
  for (int i = 0; i < a.n; i++) {
    a.w[i].local_rank = i;
    a.w[i].rank = cfg->node_rank * a.n + i;
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
        if (a.state != G_SUCCEEDED) {
          char text[600];
          snprintf(text, sizeof text, "%s", a.summary[0] ? a.summary : "node 0 stopped");
          publish_abort(&a, a.state == G_STOPPED ? 128 + a.signal_got : a.exit_code, text);
        }
      }
      /* wait for the nodes that joined this round (a node that never came cannot say bye) */
      char val[32], key[128];
      bool found;
      round_key(&a, key, sizeof key, "join");
      kv_peek(&a, key, val, sizeof val, &found);
      long long others = found ? strtoll(val, NULL, 10) - 1 : 0;
      kv_peek(&a, "launch/bye", val, sizeof val, &found);
      if ((found ? strtoll(val, NULL, 10) : 0) >= others || ct_now() > linger_until) break;
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
    if (a.state == G_INIT && multi(&a) && wait_s > 0.05) wait_s = 0.05;
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
    if (ct_now() >= a.next_tick) {
      a.next_tick = ct_now() + cfg->monitor_interval;
      for (int i = 0; i < a.n; i++)
        if (!a.w[i].running) ct_worker_check_group(&a.w[i]);
      if (a.state == G_HEALTHY) check_remote(&a);
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
  if (multi(&a) && a.client && !a.said_bye) {
    if (ct_store_add(a.client, "launch/bye", 1, NULL) != CT_OK) ct_clear_error();
    a.said_bye = true;
  }
  release_workers(&a);
  reap(&a);
  free(fds);
  free(owner);
  free(a.w);
  ct_store_close(a.client);
  ct_store_server_stop(a.server);
  close(a.sigfd);
  return code;
}

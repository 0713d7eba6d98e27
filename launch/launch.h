/* launch/launch.h — ctrain-launch, layered like torchrun:
 *   CLI (main.c, config.c: argv -> ct_launch_config)
 *   -> agent (agent.c: one worker group per node, an event loop and an explicit state machine
 *      INIT -> HEALTHY -> SUCCEEDED | UNHEALTHY -> (restart: INIT) | FAILED, or STOPPED on a
 *      signal; a restart budget)
 *   -> workers (worker.c: spawn in their own process group, pipe their output, tear down)
 *   -> rendezvous (parallel/store.h: node 0's launcher hosts the store in its poll() loop;
 *      node ranks, heartbeats and elastic membership go through it, see agent.c).
 * Only main() prints usage errors and exits; the agent reports worker failures itself (that is
 * its job) and returns the exit code to use.
 */
#ifndef CT_LAUNCH_H
#define CT_LAUNCH_H

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

#include "common/status.h"

#define CT_LAUNCH_TAIL_LINES 10 /* lines of a failed worker's output in the failure report */

typedef struct ct_launch_config {
  int nproc_per_node;        /* resolved from --nproc_per_node N|gpu|cpu|auto */
  int nnodes;                /* nodes in the run; elastic runs (--nnodes MIN:MAX): MAX */
  int min_nodes;             /* elastic: the group starts (and goes on) with at least this many;
                                == nnodes for a fixed count */
  int node_rank;             /* -1: assigned by the store (first come, first served) */
  char master_addr[256];     /* store host (node 0) */
  int master_port;           /* store port; 0 = pick a free one (--standalone) */
  bool standalone;
  int max_restarts;
  double monitor_interval;   /* seconds between monitor ticks */
  double grace_period;       /* SIGTERM -> SIGKILL, seconds */
  double rdzv_timeout;       /* how long nodes wait for each other, seconds */
  double rdzv_last_call;     /* elastic: once MIN nodes joined, how long to wait for MAX */
  double heartbeat_timeout;  /* a node silent this long is lost, seconds */
  char socket_ifname[64];    /* --socket_ifname: NCCL_ and CTRAIN_SOCKET_IFNAME for workers */
  bool keep_global_batch;    /* elastic: scale train.grad_accum with the world size */
  char log_dir[PATH_MAX];    /* "" = no per-rank log files */
  bool tee;                  /* worker output on the console, "[rankN]: " prefixed */
  bool *show_local;          /* --local_ranks_filter: which local ranks reach the console (NULL = all) */
  char run_id[128];          /* "" = random (single node) / agreed through the store */
  char program[PATH_MAX];    /* what each worker runs: ctrain, or --cmd */
  bool custom_cmd;           /* --cmd given: run program with args as they are */
  int nargs;
  char **args;               /* positional arguments after the options (CONFIG.toml k=v ...) */
} ct_launch_config;

#define CT_LAUNCH_CONFIG_INIT                                                                   \
  {.nproc_per_node = 1, .nnodes = 1, .min_nodes = 1, .node_rank = -1, .master_addr = "127.0.0.1", \
   .master_port = 29500, .max_restarts = 0, .monitor_interval = 0.5, .grace_period = 60.0,      \
   .rdzv_timeout = 600.0, .rdzv_last_call = 30.0, .heartbeat_timeout = 30.0,                    \
   .keep_global_batch = true, .tee = true}

/* Parses argv (argv[0] is the program). *help is set for --help (usage already printed to
 * stdout). CT_ERR_USAGE with one line naming the option on bad input. The config points into
 * argv for the positional arguments. */
ct_status ct_launch_parse(int argc, char **argv, ct_launch_config *cfg, bool *help);
void ct_launch_config_free(ct_launch_config *cfg);
void ct_launch_usage(FILE *f);

/* ---- workers (worker.c) ---- */

typedef struct ct_worker {
  int local_rank, rank;
  pid_t pid;           /* process (and process group) id; 0 before spawn */
  bool running;        /* leader not reaped yet */
  bool group_alive;    /* leader or anything left in its process group */
  int wait_status;     /* waitpid status once reaped */
  int out_fd, err_fd;  /* read ends of its stdout / stderr pipes, -1 when closed */
  int log_fd;          /* rank_N.log, -1 when --log_dir is not set */
  bool show;           /* its lines reach the console */
  char *partial[2];    /* an unfinished line per stream */
  size_t partial_len[2];
  char *tail[CT_LAUNCH_TAIL_LINES]; /* ring of its last lines (both streams) */
  int tail_next, tail_count;
} ct_worker;

/* Starts w (rank, local_rank and show set) running argv with envp, in its own process group,
 * with PR_SET_PDEATHSIG(SIGKILL), stdin from /dev/null and stdout/stderr piped back. With a
 * log_dir, its lines also go to log_dir/rank_N.log (truncated at restart 0, appended after). */
ct_status ct_worker_spawn(ct_worker *w, char *const *argv, char *const *envp, const char *log_dir,
                          int restart);

/* Reads what is available on fd (one of w's pipes) and passes complete lines on to the console
 * ("[rankN]: " prefix), the log file and the tail ring. Closes the pipe at EOF. */
void ct_worker_read(ct_worker *w, int fd);

/* Reads what is in the pipes now without blocking and flushes unfinished lines (so a failure
 * report has the worker's last words); the pipes stay open until EOF or release. */
void ct_worker_drain(ct_worker *w);

/* Sends sig to w's process group (nothing when the group is gone). */
void ct_worker_signal(ct_worker *w, int sig);

/* Refreshes w->group_alive (kill(-pgid, 0)). */
void ct_worker_check_group(ct_worker *w);

/* Appends the tail ring to buf as indented lines. */
void ct_worker_format_tail(const ct_worker *w, char *buf, size_t cap);

/* Frees buffers and closes fds (the process must be gone). */
void ct_worker_release(ct_worker *w);

/* "SIGKILL" for 9, or "signal 42". */
const char *ct_signal_name(int sig, char *buf, size_t cap);

/* ---- agent (agent.c) ---- */

/* Runs the worker group to completion and returns the launcher's exit code: 0 success, the
 * failing worker's code (128+signal for a signal), 128+sig when the launcher was signalled,
 * 2 for usage problems found late (port in use), 1 for launcher failures. */
int ct_agent_run(const ct_launch_config *cfg);

#endif

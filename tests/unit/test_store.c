/* tests/unit/test_store.c — the rendezvous store (set/get/add/wait/delete/check/barrier across
 * processes, token refusal, timeouts that name keys, port in use, both server modes) and the
 * distributed environment detection (launcher / Open MPI / Slurm variables, node lists). */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "ct_test.h"
#include "parallel/env.h"
#include "parallel/store.h"

static const char *TOKEN = "0123456789abcdef0123456789abcdef";

#define CHECK_ERR(call, want_status, substr)                                                   \
  do {                                                                                         \
    ct_status s_ = (call);                                                                     \
    CHECK_MSG(s_ == (want_status) && strstr(ct_last_error(), (substr)),                        \
              "%s -> %s \"%s\", want %s containing \"%s\"", #call, ct_status_str(s_),          \
              ct_last_error(), ct_status_str(want_status), (substr));                          \
  } while (0)

/* Waits for a forked child; returns its exit code (or 100 + signal). */
static int reap(pid_t pid) {
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + WTERMSIG(st);
}

/* ---------------------------------------------------------------- basic operations */

static void test_basic(int port) {
  ct_store *c = NULL;
  CHECK(ct_store_connect("127.0.0.1", port, TOKEN, 5, &c) == CT_OK);
  if (!c) return;
  const unsigned char bin[5] = {1, 0, 2, 0, 255};
  CHECK(ct_store_set(c, "bin", bin, sizeof bin) == CT_OK);
  void *v = NULL;
  size_t n = 0;
  CHECK(ct_store_get(c, "bin", 1, &v, &n) == CT_OK);
  CHECK(n == 5 && v && !memcmp(v, bin, 5) && ((char *)v)[5] == 0);
  free(v);
  /* overwrite, empty value */
  CHECK(ct_store_set(c, "bin", "", 0) == CT_OK);
  CHECK(ct_store_get(c, "bin", 1, &v, &n) == CT_OK && n == 0 && v && ((char *)v)[0] == 0);
  free(v);
  bool yes = false;
  CHECK(ct_store_check(c, "bin", &yes) == CT_OK && yes);
  CHECK(ct_store_delete(c, "bin", &yes) == CT_OK && yes);
  CHECK(ct_store_check(c, "bin", &yes) == CT_OK && !yes);
  CHECK(ct_store_delete(c, "bin", &yes) == CT_OK && !yes);
  /* counters */
  int64_t x = 0;
  CHECK(ct_store_add(c, "ctr", 5, &x) == CT_OK && x == 5);
  CHECK(ct_store_add(c, "ctr", -2, &x) == CT_OK && x == 3);
  CHECK(ct_store_add(c, "ctr", 0, &x) == CT_OK && x == 3);
  CHECK(ct_store_get(c, "ctr", 1, &v, &n) == CT_OK && n == 1 && !memcmp(v, "3", 1));
  free(v);
  CHECK(ct_store_set(c, "text", "hello", 5) == CT_OK);
  CHECK_ERR(ct_store_add(c, "text", 1, &x), CT_ERR_RUNTIME, "not an integer counter");
  /* the connection is still usable after a refused add */
  CHECK(ct_store_check(c, "text", &yes) == CT_OK && yes);
  /* a large value */
  size_t big = 8u << 20;
  unsigned char *p = malloc(big);
  for (size_t i = 0; i < big; i++) p[i] = (unsigned char)(i * 2654435761u >> 13);
  CHECK(ct_store_set(c, "big", p, big) == CT_OK);
  CHECK(ct_store_get(c, "big", 5, &v, &n) == CT_OK && n == big && v && !memcmp(v, p, big));
  free(v);
  free(p);
  /* wait on present keys returns at once */
  const char *keys[2] = {"ctr", "text"};
  CHECK(ct_store_wait(c, keys, 2, 1) == CT_OK);
  /* key prefixes: a prefixed handle's "k" is the plain handle's "w1/k" */
  ct_store *pc = NULL;
  CHECK(ct_store_clone(c, 5, &pc) == CT_OK);
  if (pc) {
    CHECK(ct_store_set_prefix(pc, "w1/") == CT_OK);
    CHECK(ct_store_set(pc, "k", "pv", 2) == CT_OK);
    CHECK(ct_store_get(c, "w1/k", 1, &v, &n) == CT_OK && n == 2 && !memcmp(v, "pv", 2));
    free(v);
    CHECK(ct_store_check(pc, "w1/k", &yes) == CT_OK && !yes);
    const char *missing[1] = {"absent"};
    CHECK_ERR(ct_store_wait(pc, missing, 1, 0.2), CT_ERR_RUNTIME, "never set: \"absent\"");
    ct_store_close(pc);
  }
  CHECK(strstr(ct_store_address(c), "127.0.0.1:") == ct_store_address(c));
  ct_store_close(c);
}

/* ---------------------------------------------------------------- timeouts and refusals */

static void test_errors(int port) {
  ct_store *c = NULL;
  CHECK(ct_store_connect("127.0.0.1", port, TOKEN, 5, &c) == CT_OK);
  if (!c) return;
  double t0 = ct_now();
  void *v = NULL;
  CHECK_ERR(ct_store_get(c, "no/such/key", 0.3, &v, NULL), CT_ERR_RUNTIME, "get \"no/such/key\" timed out after 0.");
  double dt = ct_now() - t0;
  CHECK_MSG(dt >= 0.25 && dt < 2.0, "get timeout took %.2f s", dt);
  CHECK(v == NULL);
  /* the connection stays usable after a server-side timeout */
  CHECK(ct_store_set(c, "present", "1", 1) == CT_OK);
  const char *keys[3] = {"present", "missing-a", "missing-b"};
  t0 = ct_now();
  CHECK_ERR(ct_store_wait(c, keys, 3, 0.3), CT_ERR_RUNTIME, "2 of 3 key(s) never set: \"missing-a\", \"missing-b\"");
  CHECK(strstr(ct_last_error(), "timed out after 0.") != NULL);
  dt = ct_now() - t0;
  CHECK_MSG(dt >= 0.25 && dt < 2.0, "wait timeout took %.2f s", dt);
  /* a barrier nobody else joins names the missing ranks */
  CHECK_ERR(ct_store_barrier(c, "lonely", 0, 3, 0.3), CT_ERR_RUNTIME, "1 of 3 ranks arrived; missing ranks 1, 2");
  ct_store_close(c);

  /* wrong token: refused, with the address in the message */
  char want[128];
  snprintf(want, sizeof want, "store at 127.0.0.1:%d refused the connection: wrong token", port);
  c = NULL;
  CHECK_ERR(ct_store_connect("127.0.0.1", port, "not-the-token", 5, &c), CT_ERR_RUNTIME, want);
  CHECK(c == NULL);
  CHECK_ERR(ct_store_connect("127.0.0.1", port, "", 5, &c), CT_ERR_RUNTIME, "wrong token");

  /* nothing listening: retries, then a message naming the address */
  ct_store_server *tmp = NULL;
  int free_port = 0;
  CHECK(ct_store_server_start("127.0.0.1", 0, TOKEN, &tmp, &free_port) == CT_OK);
  ct_store_server_stop(tmp);
  snprintf(want, sizeof want, "could not connect to the store at 127.0.0.1:%d within 0.3 s", free_port);
  t0 = ct_now();
  CHECK_ERR(ct_store_connect("127.0.0.1", free_port, TOKEN, 0.3, &c), CT_ERR_RUNTIME, want);
  dt = ct_now() - t0;
  CHECK_MSG(dt >= 0.2 && dt < 2.0, "connect timeout took %.2f s", dt);

  /* port in use */
  ct_store_server *dup = NULL;
  snprintf(want, sizeof want, "port %d is already in use", port);
  CHECK_ERR(ct_store_server_start("127.0.0.1", port, TOKEN, &dup, NULL), CT_ERR_USAGE, want);
  CHECK(dup == NULL);
  CHECK_ERR(ct_store_server_start(NULL, port, TOKEN, &dup, NULL), CT_ERR_USAGE, want);
  CHECK(strchr(ct_last_error(), '\n') == NULL); /* one line */
}

/* ---------------------------------------------------------------- across processes */

/* Child: get blocks until the parent sets the key later. */
static int child_blocking_get(int port) {
  ct_store *c;
  if (ct_store_connect("127.0.0.1", port, TOKEN, 5, &c)) return 1;
  double t0 = ct_now();
  void *v;
  size_t n;
  if (ct_store_get(c, "late", 10, &v, &n)) return 2;
  int ok = n == 4 && !memcmp(v, "late", 4) && ct_now() - t0 >= 0.15;
  free(v);
  /* a wait for two keys set at different times */
  const char *keys[2] = {"late-a", "late-b"};
  if (ct_store_wait(c, keys, 2, 10)) return 3;
  ct_store_close(c);
  return ok ? 0 : 4;
}

/* Child: rounds of (add, barrier, read) — every rank must see the full count after each
 * barrier of the round, which only holds if nobody leaves a barrier early. */
static int child_barrier(int port, int rank, int world, int rounds) {
  ct_store *c;
  if (ct_store_connect("127.0.0.1", port, TOKEN, 10, &c)) return 1;
  for (int r = 0; r < rounds; r++) {
    int64_t x;
    if (ct_store_add(c, "bar/ctr", 1, &x)) return 2;
    if (ct_store_barrier(c, "bar", rank, world, 20)) {
      fprintf(stderr, "rank %d: %s\n", rank, ct_last_error());
      return 3;
    }
    if (ct_store_add(c, "bar/ctr", 0, &x)) return 4;
    if (x < (int64_t)world * (r + 1)) {
      fprintf(stderr, "rank %d round %d: counter %lld < %d\n", rank, r, (long long)x, world * (r + 1));
      return 5;
    }
    if (ct_store_barrier(c, "bar2", rank, world, 20)) return 6; /* nobody adds before all read */
  }
  ct_store_close(c);
  return 0;
}

static void test_processes(int port) {
  ct_store *c = NULL;
  CHECK(ct_store_connect("127.0.0.1", port, TOKEN, 5, &c) == CT_OK);
  if (!c) return;
  pid_t pid = fork();
  if (pid == 0) _exit(child_blocking_get(port));
  usleep(300000);
  CHECK(ct_store_set(c, "late", "late", 4) == CT_OK);
  usleep(50000);
  CHECK(ct_store_set(c, "late-a", "a", 1) == CT_OK);
  usleep(50000);
  CHECK(ct_store_set(c, "late-b", "b", 1) == CT_OK);
  CHECK_MSG(reap(pid) == 0, "blocking get/wait child failed");

  enum { WORLD = 6, ROUNDS = 5 };
  pid_t kids[WORLD];
  for (int r = 0; r < WORLD; r++) {
    kids[r] = fork();
    if (kids[r] == 0) _exit(child_barrier(port, r, WORLD, ROUNDS));
  }
  for (int r = 0; r < WORLD; r++) {
    int rc = reap(kids[r]);
    CHECK_MSG(rc == 0, "barrier rank %d exited %d", r, rc);
  }
  int64_t total = 0;
  CHECK(ct_store_add(c, "bar/ctr", 0, &total) == CT_OK && total == WORLD * ROUNDS);

  /* many concurrent clients on one counter */
  enum { MANY = 32 };
  pid_t many[MANY];
  for (int i = 0; i < MANY; i++) {
    many[i] = fork();
    if (many[i] == 0) {
      ct_store *k;
      if (ct_store_connect("127.0.0.1", port, TOKEN, 10, &k)) _exit(1);
      for (int j = 0; j < 10; j++)
        if (ct_store_add(k, "many", 1, NULL)) _exit(2);
      ct_store_close(k);
      _exit(0);
    }
  }
  int bad = 0;
  for (int i = 0; i < MANY; i++) bad += reap(many[i]) != 0;
  CHECK(bad == 0);
  CHECK(ct_store_add(c, "many", 0, &total) == CT_OK && total == MANY * 10);
  ct_store_close(c);
}

/* ---------------------------------------------------------------- integrated mode */

/* The parent drives the server from its own poll() loop (as the launcher does) and uses the
 * local_* calls; children are ordinary clients. */
static void test_integrated(void) {
  ct_store_server *srv = NULL;
  int port = 0;
  CHECK(ct_store_server_start("127.0.0.1", 0, TOKEN, &srv, &port) == CT_OK);
  if (!srv) return;
  enum { KIDS = 4 };
  pid_t kids[KIDS];
  for (int i = 0; i < KIDS; i++) {
    kids[i] = fork();
    if (kids[i] == 0) {
      ct_store *k;
      if (ct_store_connect("127.0.0.1", port, TOKEN, 10, &k)) _exit(1);
      if (ct_store_add(k, "joined", 1, NULL)) _exit(2);
      void *v;
      size_t n;
      if (ct_store_get(k, "go", 10, &v, &n)) _exit(3);
      int ok = n == 2 && !memcmp(v, "go", 2);
      free(v);
      ct_store_close(k);
      _exit(ok ? 0 : 4);
    }
  }
  double deadline = ct_now() + 10;
  bool sent_go = false;
  int exited = 0, bad = 0;
  struct pollfd fds[64];
  bool fds_ok = true, handle_ok = true;
  while (exited < KIDS && ct_now() < deadline) {
    int n = ct_store_server_poll_fds(srv, fds, 64);
    fds_ok &= n == ct_store_server_nfds(srv);
    int tmo = ct_store_server_timeout_ms(srv);
    poll(fds, (nfds_t)n, tmo < 0 || tmo > 50 ? 50 : tmo);
    handle_ok &= ct_store_server_handle(srv, fds, n) == CT_OK;
    if (!sent_go) {
      const void *v;
      size_t len;
      bool found;
      ct_store_server_local_get(srv, "joined", &v, &len, &found);
      if (found && len == 1 && !memcmp(v, "4", 1)) {
        CHECK(ct_store_server_local_set(srv, "go", "go", 2) == CT_OK);
        sent_go = true;
      }
    }
    for (int i = 0; i < KIDS; i++) {
      int st;
      if (kids[i] > 0 && waitpid(kids[i], &st, WNOHANG) == kids[i]) {
        bad += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        kids[i] = -1;
        exited++;
      }
    }
  }
  CHECK(fds_ok && handle_ok);
  CHECK(sent_go);
  CHECK_MSG(exited == KIDS && bad == 0, "%d of %d clients exited, %d failed", exited, KIDS, bad);
  int64_t x = 0;
  CHECK(ct_store_server_local_add(srv, "joined", 10, &x) == CT_OK && x == 14);
  CHECK_ERR(ct_store_server_local_add(srv, "go", 1, &x), CT_ERR_RUNTIME, "not an integer");
  for (int i = 0; i < KIDS; i++)
    if (kids[i] > 0) { kill(kids[i], SIGKILL); reap(kids[i]); }
  ct_store_server_stop(srv);
}

/* A client parked in get when the server goes away gets an error at once, not a hang. */
static void test_server_gone(void) {
  ct_store_server *srv = NULL;
  int port = 0;
  CHECK(ct_store_server_start("127.0.0.1", 0, TOKEN, &srv, &port) == CT_OK);
  CHECK(ct_store_server_start_thread(srv) == CT_OK);
  pid_t pid = fork();
  if (pid == 0) {
    ct_store *k;
    if (ct_store_connect("127.0.0.1", port, TOKEN, 5, &k)) _exit(1);
    double t0 = ct_now();
    void *v;
    ct_status st = ct_store_get(k, "never", 30, &v, NULL);
    int ok = st == CT_ERR_RUNTIME && strstr(ct_last_error(), "closed the connection") && ct_now() - t0 < 5;
    if (!ok) fprintf(stderr, "server gone: %s\n", ct_last_error());
    _exit(ok ? 0 : 2);
  }
  usleep(300000);
  ct_store_server_stop(srv);
  CHECK_MSG(reap(pid) == 0, "client parked in get did not fail promptly when the server stopped");
}

/* ---------------------------------------------------------------- Slurm node lists */

static void check_list(const char *list, const char *want) {
  char **names = NULL;
  int n = 0;
  ct_status st = ct_slurm_expand_nodelist(list, &names, &n);
  char got[1024] = "";
  for (int i = 0; i < n; i++) {
    if (i) strncat(got, " ", sizeof got - strlen(got) - 1);
    strncat(got, names[i], sizeof got - strlen(got) - 1);
    free(names[i]);
  }
  free(names);
  CHECK_MSG(st == CT_OK && !strcmp(got, want), "%s -> \"%s\" (%s), want \"%s\"", list, got,
            st ? ct_last_error() : "ok", want);
}

static void test_nodelist(void) {
  check_list("node[01-04,07],gpu-a[1-2],login", "node01 node02 node03 node04 node07 gpu-a1 gpu-a2 login");
  check_list("login", "login");
  check_list("n[8-11]", "n8 n9 n10 n11");
  check_list("n[098-101]", "n098 n099 n100 n101");
  check_list("a[1-2]b,c", "a1b a2b c");
  check_list("r[1-2]-n[01-02]", "r1-n01 r1-n02 r2-n01 r2-n02");
  check_list("x[007]", "x007");
  check_list("h1.example.com,h2.example.com", "h1.example.com h2.example.com");
  char **names;
  int n;
  CHECK_ERR(ct_slurm_expand_nodelist("node[01-04", &names, &n), CT_ERR_INPUT, "'[' without ']'");
  CHECK_ERR(ct_slurm_expand_nodelist("node[4-1]", &names, &n), CT_ERR_INPUT, "empty or too large");
  CHECK_ERR(ct_slurm_expand_nodelist("node[a-b]", &names, &n), CT_ERR_INPUT, "bad range \"a-b\"");
  CHECK_ERR(ct_slurm_expand_nodelist("", &names, &n), CT_ERR_INPUT, "no hosts");
  CHECK_ERR(ct_slurm_expand_nodelist("a,,b", &names, &n), CT_ERR_INPUT, "empty host name");
  CHECK_ERR(ct_slurm_expand_nodelist("n[0-99999999]", &names, &n), CT_ERR_INPUT, "too large");
}

/* ---------------------------------------------------------------- environment detection */

static const char *ALL_VARS[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
    "CTRAIN_RESTART_COUNT", "CTRAIN_RUN_ID", "CTRAIN_STORE_TOKEN", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_NODE_RANK", "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE",
    "OMPI_MCA_orte_hnp_uri", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_STEP_NUM_TASKS",
    "SLURM_LOCALID", "SLURM_NNODES", "SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NODEID",
    "SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_ID", "SLURM_JOBID",
    "SLURM_STEP_ID", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", NULL};

static void clear_env(void) {
  for (int i = 0; ALL_VARS[i]; i++) unsetenv(ALL_VARS[i]);
}

static void test_env(void) {
  ct_dist_env e;
  clear_env();
  CHECK(ct_dist_env_detect(&e) == CT_OK);
  CHECK(!strcmp(e.source, "single") && e.rank == 0 && e.world_size == 1 && e.local_world_size == 1 && e.nnodes == 1);

  /* ctrain-launch / torchrun */
  setenv("RANK", "5", 1);
  setenv("WORLD_SIZE", "8", 1);
  setenv("LOCAL_RANK", "1", 1);
  setenv("LOCAL_WORLD_SIZE", "4", 1);
  setenv("GROUP_RANK", "1", 1);
  setenv("MASTER_ADDR", "10.1.2.3", 1);
  setenv("MASTER_PORT", "29612", 1);
  setenv("CTRAIN_RESTART_COUNT", "2", 1);
  setenv("CTRAIN_RUN_ID", "run-xyz", 1);
  setenv("CTRAIN_STORE_TOKEN", TOKEN, 1);
  CHECK(ct_dist_env_detect(&e) == CT_OK);
  CHECK(!strcmp(e.source, "launcher") && e.rank == 5 && e.world_size == 8 && e.local_rank == 1 &&
        e.local_world_size == 4 && e.node_rank == 1 && e.nnodes == 2);
  CHECK(!strcmp(e.master_addr, "10.1.2.3") && e.master_port == 29612 && e.restart_count == 2);
  CHECK(!strcmp(e.run_id, "run-xyz") && !strcmp(e.store_token, TOKEN) && !e.rank0_hosts_store);
  char line[512];
  ct_dist_env_describe(&e, line, sizeof line);
  CHECK_MSG(strstr(line, "rank 5/8 (local 1/4, node 1/2) via launcher, store 10.1.2.3:29612") &&
            strstr(line, "restart 2"), "%s", line);
  setenv("RANK", "8", 1);
  CHECK_ERR(ct_dist_env_detect(&e), CT_ERR_USAGE, "RANK=\"8\" is not an integer in 0..7");
  setenv("RANK", "x", 1);
  CHECK_ERR(ct_dist_env_detect(&e), CT_ERR_USAGE, "RANK=\"x\"");
  /* by hand: only RANK / WORLD_SIZE; rank 0 hosts the store */
  clear_env();
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "2", 1);
  CHECK(ct_dist_env_detect(&e) == CT_OK);
  CHECK(e.rank == 1 && e.local_rank == 1 && e.local_world_size == 2 && e.rank0_hosts_store &&
        !strcmp(e.master_addr, "127.0.0.1") && e.master_port == 29500 && strlen(e.store_token) == 32);

  /* mpirun */
  clear_env();
  setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
  setenv("OMPI_MCA_ess_base_jobid", "2867200001", 1);
  CHECK(ct_dist_env_detect(&e) == CT_OK);
  CHECK(!strcmp(e.source, "openmpi") && e.rank == 3 && e.world_size == 4 && e.local_rank == 3 &&
        e.local_world_size == 4 && e.nnodes == 1 && e.node_rank == 0 && e.rank0_hosts_store);
  CHECK(!strcmp(e.master_addr, "127.0.0.1") && e.master_port >= 29500 && e.master_port < 30500);
  ct_dist_env e2;
  setenv("OMPI_COMM_WORLD_RANK", "0", 1);
  CHECK(ct_dist_env_detect(&e2) == CT_OK);
  CHECK(!strcmp(e.store_token, e2.store_token) && e.master_port == e2.master_port); /* same job, same store */
  setenv("OMPI_MCA_ess_base_jobid", "2867200002", 1);
  CHECK(ct_dist_env_detect(&e2) == CT_OK);
  CHECK(strcmp(e.store_token, e2.store_token) != 0); /* another job, another token */
  setenv("MASTER_PORT", "31000", 1);
  CHECK(ct_dist_env_detect(&e2) == CT_OK && e2.master_port == 31000);
  /* two nodes and nobody says where rank 0 is */
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1);
  CHECK_ERR(ct_dist_env_detect(&e2), CT_ERR_USAGE, "set MASTER_ADDR");
  setenv("MASTER_ADDR", "host-a", 1);
  CHECK(ct_dist_env_detect(&e2) == CT_OK && e2.nnodes == 2 && !strcmp(e2.master_addr, "host-a"));
  /* RANK/WORLD_SIZE win over Open MPI's */
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "3", 1);
  CHECK(ct_dist_env_detect(&e2) == CT_OK && !strcmp(e2.source, "launcher") && e2.world_size == 3);

  /* a batch script's own shell (no srun step): one process, whatever SLURM_NTASKS says */
  clear_env();
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_NTASKS", "8", 1);
  CHECK(ct_dist_env_detect(&e) == CT_OK && !strcmp(e.source, "single") && e.world_size == 1);

  /* srun */
  clear_env();
  setenv("SLURM_STEP_ID", "0", 1);
  setenv("SLURM_PROCID", "5", 1);
  setenv("SLURM_NTASKS", "8", 1);
  setenv("SLURM_LOCALID", "1", 1);
  setenv("SLURM_NNODES", "2", 1);
  setenv("SLURM_NODEID", "1", 1);
  setenv("SLURM_JOB_NODELIST", "gpu[07-08]", 1);
  setenv("SLURM_JOB_ID", "123456", 1);
  setenv("SLURM_TASKS_PER_NODE", "4(x2)", 1);
  CHECK(ct_dist_env_detect(&e) == CT_OK);
  CHECK(!strcmp(e.source, "slurm") && e.rank == 5 && e.world_size == 8 && e.local_rank == 1 &&
        e.local_world_size == 4 && e.node_rank == 1 && e.nnodes == 2 && e.rank0_hosts_store);
  CHECK_MSG(!strcmp(e.master_addr, "gpu07") && e.master_port == 29500 + 123456 % 1000, "%s:%d", e.master_addr,
            e.master_port);
  CHECK(!strcmp(e.run_id, "slurm-123456") && strlen(e.store_token) == 32);
  /* the step's list wins; uneven tasks per node */
  setenv("SLURM_STEP_NODELIST", "gpu[08],cpu1", 1);
  setenv("SLURM_TASKS_PER_NODE", "5,3", 1);
  setenv("SLURM_STEP_ID", "0", 1);
  setenv("SLURM_PROCID", "6", 1);
  setenv("SLURM_LOCALID", "1", 1);
  CHECK(ct_dist_env_detect(&e) == CT_OK);
  CHECK_MSG(!strcmp(e.master_addr, "gpu08") && e.local_world_size == 3, "%s %d", e.master_addr, e.local_world_size);
  setenv("SLURM_LOCALID", "3", 1);
  CHECK_ERR(ct_dist_env_detect(&e), CT_ERR_USAGE, "SLURM_LOCALID=3 but only 3 task(s) on this node");
  setenv("SLURM_JOB_NODELIST", "gpu[07-08", 1);
  unsetenv("SLURM_STEP_NODELIST");
  setenv("SLURM_LOCALID", "1", 1);
  CHECK_ERR(ct_dist_env_detect(&e), CT_ERR_INPUT, "gpu[07-08");
  clear_env();
}

/* Two processes with a simulated srun environment: rank 0 hosts the store, both meet. */
static int child_slurm(int rank, int port) {
  clear_env();
  char p[16];
  snprintf(p, sizeof p, "%d", port);
  setenv("SLURM_STEP_ID", "0", 1);
  setenv("SLURM_PROCID", rank ? "1" : "0", 1);
  setenv("SLURM_LOCALID", rank ? "1" : "0", 1);
  setenv("SLURM_NTASKS", "2", 1);
  setenv("SLURM_NNODES", "1", 1);
  setenv("SLURM_JOB_NODELIST", "no-such-host-ctrain", 1); /* single node: loopback is used */
  setenv("SLURM_JOB_ID", "77", 1);
  setenv("MASTER_PORT", p, 1);
  ct_dist_env e;
  if (ct_dist_env_detect(&e)) return 1;
  ct_store_server *srv;
  ct_store *c;
  if (ct_dist_store_open(&e, 10, &srv, &c)) { fprintf(stderr, "rank %d: %s\n", rank, ct_last_error()); return 2; }
  if ((rank == 0) != (srv != NULL)) return 3;
  if (ct_store_barrier(c, "meet", e.rank, e.world_size, 10)) return 4;
  char v[16];
  snprintf(v, sizeof v, "r%d", rank);
  if (ct_store_set(c, v, v, strlen(v))) return 5;
  void *o;
  snprintf(v, sizeof v, "r%d", 1 - rank);
  if (ct_store_get(c, v, 10, &o, NULL)) return 6;
  free(o);
  if (ct_store_barrier(c, "bye", e.rank, e.world_size, 10)) return 7;
  ct_store_close(c);
  ct_store_server_stop_when_idle(srv, 10);
  return 0;
}

static void test_store_open(void) {
  clear_env();
  ct_dist_env e;
  ct_store_server *srv = NULL;
  ct_store *c = NULL;
  CHECK(ct_dist_env_detect(&e) == CT_OK);
  CHECK(ct_dist_store_open(&e, 5, &srv, &c) == CT_OK && srv && c);
  if (c) CHECK(ct_store_barrier(c, "solo", 0, 1, 5) == CT_OK);
  ct_store_close(c);
  ct_store_server_stop(srv);

  int port = 0;
  CHECK(ct_store_server_start("127.0.0.1", 0, NULL, &srv, &port) == CT_OK);
  ct_store_server_stop(srv);
  pid_t a = fork();
  if (a == 0) _exit(child_slurm(1, port)); /* the client starts first and retries */
  usleep(200000);
  pid_t b = fork();
  if (b == 0) _exit(child_slurm(0, port));
  int ra = reap(a), rb = reap(b);
  CHECK_MSG(ra == 0 && rb == 0, "simulated srun ranks exited %d and %d", ra, rb);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  ct_store_server *srv = NULL;
  int port = 0;
  CHECK(ct_store_server_start("127.0.0.1", 0, TOKEN, &srv, &port) == CT_OK);
  CHECK(port > 0);
  CHECK(ct_store_server_start_thread(srv) == CT_OK);
  if (srv) {
    test_basic(port);
    test_errors(port);
    test_processes(port);
    ct_store_server_stop(srv);
  }
  test_integrated();
  test_server_gone();
  test_nodelist();
  test_env();
  test_store_open();
  return ct_test_finish();
}

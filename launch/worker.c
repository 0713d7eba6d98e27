/* launch/worker.c — one worker process: spawn, output lines, signals, tear-down.
 *
 * A worker runs in its own process group (pgid = its pid), so the launcher can signal it and
 * everything it started with one kill(-pgid, sig), and so a terminal's Ctrl-C reaches only the
 * launcher, which forwards it. PR_SET_PDEATHSIG(SIGKILL) kills the worker if the launcher dies
 * (even by SIGKILL); the getppid() check after it closes the window in which the launcher died
 * before the call.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "common/util.h"
#include "launch/launch.h"

#define LINE_MAX_BYTES 65536 /* longer lines are split: bounded memory per worker */

const char *ct_signal_name(int sig, char *buf, size_t cap) {
  static const char *const names[] = {
      [SIGHUP] = "SIGHUP",   [SIGINT] = "SIGINT",       [SIGQUIT] = "SIGQUIT", [SIGILL] = "SIGILL",
      [SIGTRAP] = "SIGTRAP", [SIGABRT] = "SIGABRT",     [SIGBUS] = "SIGBUS",   [SIGFPE] = "SIGFPE",
      [SIGKILL] = "SIGKILL", [SIGUSR1] = "SIGUSR1",     [SIGSEGV] = "SIGSEGV", [SIGUSR2] = "SIGUSR2",
      [SIGPIPE] = "SIGPIPE", [SIGALRM] = "SIGALRM",     [SIGTERM] = "SIGTERM", [SIGCHLD] = "SIGCHLD",
      [SIGCONT] = "SIGCONT", [SIGSTOP] = "SIGSTOP",     [SIGTSTP] = "SIGTSTP", [SIGTTIN] = "SIGTTIN",
      [SIGTTOU] = "SIGTTOU", [SIGURG] = "SIGURG",       [SIGXCPU] = "SIGXCPU", [SIGXFSZ] = "SIGXFSZ",
      [SIGVTALRM] = "SIGVTALRM", [SIGPROF] = "SIGPROF", [SIGWINCH] = "SIGWINCH", [SIGIO] = "SIGIO",
      [SIGPWR] = "SIGPWR",   [SIGSYS] = "SIGSYS"};
  if (sig > 0 && (size_t)sig < sizeof names / sizeof names[0] && names[sig]) return names[sig];
  snprintf(buf, cap, "signal %d", sig);
  return buf;
}

/* write() all of it; a console or log that fails is not the workers' problem, so errors are
 * dropped (the launcher ignores SIGPIPE). */
static void write_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w;
    n -= (size_t)w;
  }
}

/* One complete line (without its newline) from stream 0 (stdout) or 1 (stderr). */
static void emit_line(ct_worker *w, int stream, const char *line, size_t len) {
  if (w->show) {
    char prefix[32];
    int pl = snprintf(prefix, sizeof prefix, "[rank%d]: ", w->rank);
    char small[4096];
    size_t total = (size_t)pl + len + 1;
    /* one write per line, so lines of different ranks do not interleave mid-line */
    char *out = total <= sizeof small ? small : malloc(total);
    if (out) {
      memcpy(out, prefix, (size_t)pl);
      memcpy(out + pl, line, len);
      out[total - 1] = '\n';
      write_all(stream ? STDERR_FILENO : STDOUT_FILENO, out, total);
      if (out != small) free(out);
    }
  }
  if (w->log_fd >= 0) {
    char *out = malloc(len + 1);
    if (out) {
      memcpy(out, line, len);
      out[len] = '\n';
      write_all(w->log_fd, out, len + 1);
      free(out);
    }
  }
  char *copy = malloc(len + 1);
  if (copy) {
    memcpy(copy, line, len);
    copy[len] = '\0';
    free(w->tail[w->tail_next]);
    w->tail[w->tail_next] = copy;
    w->tail_next = (w->tail_next + 1) % CT_LAUNCH_TAIL_LINES;
    if (w->tail_count < CT_LAUNCH_TAIL_LINES) w->tail_count++;
  }
}

static void partial_append(ct_worker *w, int stream, const char *p, size_t n) {
  char *grown = realloc(w->partial[stream], w->partial_len[stream] + n + 1);
  if (!grown) return; /* out of memory: the fragment is lost, the worker is not */
  memcpy(grown + w->partial_len[stream], p, n);
  w->partial[stream] = grown;
  w->partial_len[stream] += n;
}

static void partial_flush(ct_worker *w, int stream) {
  if (w->partial_len[stream]) emit_line(w, stream, w->partial[stream], w->partial_len[stream]);
  w->partial_len[stream] = 0;
}

static void consume(ct_worker *w, int stream, const char *p, size_t n) {
  while (n) {
    const char *nl = memchr(p, '\n', n);
    size_t seg = nl ? (size_t)(nl - p) : n;
    if (w->partial_len[stream] + seg > LINE_MAX_BYTES) {
      /* split an endless line */
      size_t take = LINE_MAX_BYTES > w->partial_len[stream] ? LINE_MAX_BYTES - w->partial_len[stream] : 0;
      partial_append(w, stream, p, take);
      partial_flush(w, stream);
      p += take;
      n -= take;
      continue;
    }
    if (nl) {
      if (w->partial_len[stream]) {
        partial_append(w, stream, p, seg);
        partial_flush(w, stream);
      } else {
        emit_line(w, stream, p, seg);
      }
      p += seg + 1;
      n -= seg + 1;
    } else {
      partial_append(w, stream, p, seg);
      return;
    }
  }
}

/* Reads until EAGAIN (or at most a few buffers, to stay fair to the other workers). */
static void read_stream(ct_worker *w, int stream, int max_reads) {
  int *fd = stream ? &w->err_fd : &w->out_fd;
  char buf[65536];
  for (int i = 0; *fd >= 0 && i < max_reads; i++) {
    ssize_t r = read(*fd, buf, sizeof buf);
    if (r > 0) {
      consume(w, stream, buf, (size_t)r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    partial_flush(w, stream); /* EOF (or an error): the stream is over */
    close(*fd);
    *fd = -1;
  }
}

void ct_worker_read(ct_worker *w, int fd) {
  if (fd >= 0 && fd == w->out_fd) read_stream(w, 0, 4);
  else if (fd >= 0 && fd == w->err_fd) read_stream(w, 1, 4);
}

void ct_worker_drain(ct_worker *w) {
  read_stream(w, 0, 1 << 20);
  read_stream(w, 1, 1 << 20);
  partial_flush(w, 0);
  partial_flush(w, 1);
}

void ct_worker_signal(ct_worker *w, int sig) {
  if (w->pid > 0 && (w->running || w->group_alive)) {
    if (kill(-w->pid, sig) != 0 && errno == ESRCH) w->group_alive = w->running;
  }
}

void ct_worker_check_group(ct_worker *w) {
  /* The group outlives its leader while anything it started lives on; the launcher is a child
   * subreaper, so such orphans are its children and get reaped, never left as zombies. */
  w->group_alive = w->pid > 0 && (w->running || kill(-w->pid, 0) == 0 || errno == EPERM);
}

void ct_worker_format_tail(const ct_worker *w, char *buf, size_t cap) {
  size_t used = strlen(buf);
  int start = (w->tail_next - w->tail_count + CT_LAUNCH_TAIL_LINES) % CT_LAUNCH_TAIL_LINES;
  for (int i = 0; i < w->tail_count && used + 1 < cap; i++) {
    const char *line = w->tail[(start + i) % CT_LAUNCH_TAIL_LINES];
    int n = snprintf(buf + used, cap - used, "    %.500s\n", line ? line : "");
    if (n < 0) break;
    used += (size_t)n < cap - used ? (size_t)n : cap - used - 1;
  }
}

void ct_worker_release(ct_worker *w) {
  if (w->out_fd >= 0) close(w->out_fd);
  if (w->err_fd >= 0) close(w->err_fd);
  if (w->log_fd >= 0) close(w->log_fd);
  w->out_fd = w->err_fd = w->log_fd = -1;
  for (int s = 0; s < 2; s++) {
    free(w->partial[s]);
    w->partial[s] = NULL;
    w->partial_len[s] = 0;
  }
  for (int i = 0; i < CT_LAUNCH_TAIL_LINES; i++) {
    free(w->tail[i]);
    w->tail[i] = NULL;
  }
  w->tail_next = w->tail_count = 0;
}

ct_status ct_worker_spawn(ct_worker *w, char *const *argv, char *const *envp, const char *log_dir,
                          int restart) {
  w->pid = 0;
  w->running = w->group_alive = false;
  w->out_fd = w->err_fd = w->log_fd = -1;
  if (log_dir && log_dir[0]) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/rank_%d.log", log_dir, w->rank);
    w->log_fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_APPEND | (restart == 0 ? O_TRUNC : 0), 0644);
    if (w->log_fd < 0) return ct_set_error(CT_ERR_IO, "cannot open log file %s: %s", path, strerror(errno));
    if (restart > 0) {
      char hdr[96];
      int n = snprintf(hdr, sizeof hdr, "--- ctrain-launch: restart %d ---\n", restart);
      write_all(w->log_fd, hdr, (size_t)n);
    }
  }
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    int e = errno;
    if (out[0] >= 0) { close(out[0]); close(out[1]); }
    return ct_set_error(CT_ERR_RUNTIME, "pipe for rank %d: %s", w->rank, strerror(e));
  }
  int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    int e = errno;
    close(out[0]); close(out[1]); close(err[0]); close(err[1]);
    if (devnull >= 0) close(devnull);
    return ct_set_error(CT_ERR_RUNTIME, "fork for rank %d: %s", w->rank, strerror(e));
  }
  if (pid == 0) {
    /* child: only async-signal-safe calls from here to exec */
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(128 + SIGKILL); /* the launcher is already gone */
    /* the launcher blocks its signals (signalfd) and ignores SIGPIPE: undo both for the worker */
    for (int s = 1; s < 32; s++)
      if (s != SIGKILL && s != SIGSTOP) signal(s, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    if (strchr(argv[0], '/')) execve(argv[0], argv, envp);
    else execvpe(argv[0], argv, envp);
    int e = errno;
    static const char msg[] = "ctrain-launch: cannot run ";
    write_all(STDERR_FILENO, msg, sizeof msg - 1);
    write_all(STDERR_FILENO, argv[0], strlen(argv[0]));
    write_all(STDERR_FILENO, ": ", 2);
    write_all(STDERR_FILENO, strerror(e), strlen(strerror(e)));
    write_all(STDERR_FILENO, "\n", 1);
    _exit(127);
  }
  /* parent: also set the group here, so it exists before we might signal it (the child's own
   * setpgid may not have run yet; whichever runs second is a no-op or EACCES after exec) */
  setpgid(pid, pid);
  if (devnull >= 0) close(devnull);
  close(out[1]);
  close(err[1]);
  fcntl(out[0], F_SETFL, fcntl(out[0], F_GETFL) | O_NONBLOCK);
  fcntl(err[0], F_SETFL, fcntl(err[0], F_GETFL) | O_NONBLOCK);
  w->out_fd = out[0];
  w->err_fd = err[0];
  w->pid = pid;
  w->running = w->group_alive = true;
  return CT_OK;
}

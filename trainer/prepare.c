/* trainer/prepare.c — `ctrain prepare`: text files -> train.h5 / val.h5 token files.
 *
 * argv[0] is the subcommand name ("prepare"), as main() passes it; options follow.
 * Streams file by file: one input file and the ids of one document are in memory at a time
 * (~5x the largest document with the byte tokenizer), and the token writers buffer 1 Mi tokens
 * each. The tokenizer is the built-in byte one or a tokenizer.json (trainer/tokenizer.h); the
 * files record its vocab size, end-of-text id and digest, which the loader checks. The split is by document index
 * (i % K == 0 -> val), so it depends only on the inputs and their order, never on timing.
 */
#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "trainer/data.h"
#include "trainer/tokenizer.h"

#define FORTUNES_DIR "/usr/share/games/fortunes"

typedef struct input {
  char *path;
  bool fortune; /* documents separated by lines holding only "%" */
} input;

typedef struct input_list {
  input *v;
  int n, cap;
} input_list;

static const char *usage_text =
    "usage: ctrain prepare [--out-dir DIR] [--val-every K] [--tokenizer SPEC] [FILE|GLOB ...]\n"
    "\n"
    "Tokenizes text into DIR/train.h5 and DIR/val.h5 for `ctrain train`.\n"
    "\n"
    "  --out-dir DIR     output directory (default data/fortunes)\n"
    "  --val-every K     document i goes to val when i % K == 0, else to train (default 20: 5%)\n"
    "  --tokenizer SPEC  \"byte\" (default: ids 0..255 are bytes, 256 ends a document), or a\n"
    "                    Hugging Face tokenizer.json (or a directory holding one) with a\n"
    "                    byte-level BPE: GPT-2, Qwen, Llama 3 style; documents end with its\n"
    "                    <|endoftext|> (or other end-of-text) token\n"
    "  -h, --help        print this help\n"
    "\n"
    "Without inputs, uses the Debian `fortunes` corpus (" FORTUNES_DIR "), one document per\n"
    "fortune. An input FILE with a FILE.dat companion (strfile) is read as fortunes; any other\n"
    "file is one document. Globs are expanded here, so quote them to keep the shell's hands off.\n";

static ct_status list_push(input_list *l, const char *path, bool fortune) {
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 64;
    input *v = realloc(l->v, sizeof *v * (size_t)cap);
    if (!v) return ct_set_error(CT_ERR_NOMEM, "out of memory listing inputs");
    l->v = v, l->cap = cap;
  }
  char *p = ct_strdup(path);
  if (!p) return ct_set_error(CT_ERR_NOMEM, "out of memory listing inputs");
  l->v[l->n].path = p;
  l->v[l->n].fortune = fortune;
  l->n++;
  return CT_OK;
}

static void list_free(input_list *l) {
  for (int i = 0; i < l->n; i++) free(l->v[i].path);
  free(l->v);
}

static bool has_suffix(const char *s, const char *suf) {
  size_t n = strlen(s), m = strlen(suf);
  return n >= m && strcmp(s + n - m, suf) == 0;
}

static bool has_dat_companion(const char *path) {
  char dat[4096];
  if (snprintf(dat, sizeof dat, "%s.dat", path) >= (int)sizeof dat) return false;
  return ct_file_exists(dat);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Every regular file in FORTUNES_DIR except strfile indexes (*.dat) and the *.u8 links, sorted
 * by name (bytewise, not by locale) so that the document order is the same everywhere. */
static ct_status list_fortunes_dir(input_list *out) {
  DIR *d = opendir(FORTUNES_DIR);
  if (!d)
    return ct_set_error(CT_ERR_INPUT, "%s: cannot open: %s (install the Debian `fortunes` package, "
                        "or pass input files)", FORTUNES_DIR, strerror(errno));
  ct_status st = CT_OK;
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.' || has_suffix(e->d_name, ".dat") || has_suffix(e->d_name, ".u8")) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", FORTUNES_DIR, e->d_name);
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 64;
      char **nn = realloc(names, sizeof *nn * cap);
      if (!nn) { st = ct_set_error(CT_ERR_NOMEM, "out of memory listing %s", FORTUNES_DIR); goto done; }
      names = nn;
    }
    if (!(names[n] = ct_strdup(path))) { st = ct_set_error(CT_ERR_NOMEM, "out of memory listing %s", FORTUNES_DIR); goto done; }
    n++;
  }
  qsort(names, n, sizeof *names, cmp_str);
  for (size_t i = 0; i < n && st == CT_OK; i++) st = list_push(out, names[i], true);
  if (st == CT_OK && n == 0)
    st = ct_set_error(CT_ERR_INPUT, "%s: no fortune files found (install the Debian `fortunes` package, "
                      "or pass input files)", FORTUNES_DIR);
done:
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  closedir(d);
  return st;
}

/* Appends "s" to the comma-separated list in buf. */
static void note_missing(char *buf, size_t cap, const char *what, const char *why) {
  size_t used = strlen(buf);
  snprintf(buf + used, cap - used, "%s%s (%s)", used ? ", " : "", what, why);
}

/* Expands the command-line inputs in order. Arguments with glob characters go through glob(3)
 * (sorted matches); a glob's matches skip directories and the strfile companions of fortune
 * files (X.dat, X.u8 next to a fortune file X), so a glob of everything in a fortunes directory
 * does the obvious thing. Missing files and empty globs are all named in one CT_ERR_INPUT. */
static ct_status list_args(int n_args, char **args, input_list *out) {
  char missing[2048] = "";
  int n_missing = 0;
  for (int a = 0; a < n_args; a++) {
    const char *arg = args[a];
    struct stat sb;
    if (strpbrk(arg, "*?[") == NULL || stat(arg, &sb) == 0) { /* a literal path (names may hold '[') */
      if (stat(arg, &sb) != 0) {
        note_missing(missing, sizeof missing, arg, strerror(errno));
        n_missing++;
      } else if (S_ISDIR(sb.st_mode)) {
        return ct_set_error(CT_ERR_INPUT, "%s: is a directory (pass files, or a quoted glob such as '%s/*')",
                            arg, arg);
      } else {
        CT_TRY(list_push(out, arg, has_dat_companion(arg)));
      }
      continue;
    }
    glob_t g;
    int rc = glob(arg, 0, NULL, &g);
    if (rc == GLOB_NOMATCH) {
      note_missing(missing, sizeof missing, arg, "glob matches nothing");
      n_missing++;
      continue;
    }
    if (rc != 0) {
      if (rc != GLOB_NOMATCH) globfree(&g);
      return ct_set_error(CT_ERR_IO, "%s: glob failed (%s)", arg, rc == GLOB_NOSPACE ? "out of memory" : "read error");
    }
    ct_status st = CT_OK;
    int kept = 0;
    for (size_t i = 0; i < g.gl_pathc && st == CT_OK; i++) {
      const char *p = g.gl_pathv[i];
      if (stat(p, &sb) != 0 || S_ISDIR(sb.st_mode)) continue;
      if (has_suffix(p, ".dat") || has_suffix(p, ".u8")) {
        char stem[4096];
        size_t len = strlen(p) - (has_suffix(p, ".dat") ? 4 : 3);
        if (len < sizeof stem) {
          memcpy(stem, p, len);
          stem[len] = '\0';
          if (has_dat_companion(stem)) continue;
        }
      }
      st = list_push(out, p, has_dat_companion(p));
      kept++;
    }
    globfree(&g);
    CT_TRY(st);
    if (kept == 0) {
      note_missing(missing, sizeof missing, arg, "glob matches no files");
      n_missing++;
    }
  }
  if (n_missing)
    return ct_set_error(CT_ERR_INPUT, "input%s not found: %s", n_missing > 1 ? "s" : "", missing);
  return CT_OK;
}

typedef struct split_stats {
  int64_t docs, tokens;
} split_stats;

typedef struct prep {
  ct_token_writer *w[2]; /* 0 train, 1 val */
  split_stats s[2];
  int64_t doc_index, val_every;
  const ct_tokenizer *tok;
  int32_t eot;
} prep;

static ct_status emit_doc(prep *p, const char *text, size_t len) {
  if (len == 0) return CT_OK; /* empty documents are skipped */
  int32_t *ids = NULL;
  size_t n = 0;
  CT_TRY(ct_tokenizer_encode(p->tok, text, len, &ids, &n));
  int split = p->doc_index % p->val_every == 0 ? 1 : 0;
  p->doc_index++;
  ct_status st = ct_token_writer_append(p->w[split], ids, n);
  free(ids);
  CT_TRY(st);
  CT_TRY(ct_token_writer_append(p->w[split], &p->eot, 1));
  p->s[split].docs++;
  p->s[split].tokens += (int64_t)n + 1;
  return CT_OK;
}

/* Fortune format: documents are the text between lines that are exactly "%" (the newline that
 * ends a document's last line belongs to the document). Nothing else is stripped. */
static ct_status emit_fortunes(prep *p, const char *buf, size_t len) {
  size_t doc = 0, line = 0;
  while (line < len) {
    const char *nl = memchr(buf + line, '\n', len - line);
    size_t end = nl ? (size_t)(nl - buf) : len; /* line is [line, end) */
    size_t next = nl ? end + 1 : len;
    if (end - line == 1 && buf[line] == '%') {
      CT_TRY(emit_doc(p, buf + doc, line - doc));
      doc = next;
    }
    line = next;
  }
  return emit_doc(p, buf + doc, len - doc);
}

static int progress_update(bool tty, double *last, bool force, int done, int total, int64_t bytes,
                           int64_t tokens) {
  if (!tty) return 0;
  double now = ct_now();
  if (!force && now - *last < 0.1) return 0;
  *last = now;
  fprintf(stderr, "\rprepare: %d/%d files, %.1f MB, %" PRId64 " tokens\033[K", done, total,
          (double)bytes / 1e6, tokens);
  fflush(stderr);
  return 1;
}

typedef struct prepare_opts {
  const char *out_dir, *tokenizer;
  long val_every;
  bool help;
  char **files; /* (argc,) the non-option arguments, in order */
  int n_files;
} prepare_opts;

/* Options may come before, between or after the inputs; "--" ends options. */
static ct_status parse_args(int argc, char **argv, prepare_opts *o) {
  static const char *const known[] = {"--out-dir", "--val-every", "--tokenizer", "--help"};
  bool options = true;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (options && strcmp(a, "--") == 0) { options = false; continue; }
    if (!options || a[0] != '-' || a[1] == '\0') { o->files[o->n_files++] = argv[i]; continue; }
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) { o->help = true; return CT_OK; }
    const char *val = NULL, *eq = strchr(a, '=');
    size_t name_len = eq ? (size_t)(eq - a) : strlen(a);
    int which = -1;
    for (int k = 0; k < 3; k++)
      if (strlen(known[k]) == name_len && strncmp(a, known[k], name_len) == 0) which = k;
    if (which < 0) {
      char name[128];
      snprintf(name, sizeof name, "%.*s", (int)name_len, a);
      const char *best = NULL;
      int best_d = 4;
      for (int k = 0; k < 4; k++) {
        /* a prefix ("--val") or a typo ("--out-dri") of a known option */
        int d = strncmp(known[k], name, strlen(name)) == 0 ? 0 : ct_edit_distance(name, known[k]);
        if (d < best_d) best_d = d, best = known[k];
      }
      if (best)
        return ct_set_error(CT_ERR_USAGE, "prepare: unknown option '%s' (did you mean %s?); see `ctrain prepare --help`",
                            name, best);
      return ct_set_error(CT_ERR_USAGE, "prepare: unknown option '%s'; see `ctrain prepare --help`", name);
    }
    if (eq) val = eq + 1;
    else if (i + 1 < argc) val = argv[++i];
    else return ct_set_error(CT_ERR_USAGE, "prepare: %s needs a value; see `ctrain prepare --help`", known[which]);
    if (which == 0) {
      if (!*val) return ct_set_error(CT_ERR_USAGE, "prepare: --out-dir needs a non-empty directory");
      o->out_dir = val;
    } else if (which == 1) {
      char *end;
      errno = 0;
      o->val_every = strtol(val, &end, 10);
      if (!*val || *end || errno || o->val_every < 1)
        return ct_set_error(CT_ERR_USAGE, "prepare: --val-every '%s': expected a positive integer K "
                            "(document i goes to val when i %% K == 0)", val);
    } else {
      o->tokenizer = val;
    }
  }
  if (strcmp(o->tokenizer, "byte") != 0 && !ct_file_exists(o->tokenizer))
    return ct_set_error(CT_ERR_USAGE, "prepare: --tokenizer '%s': no such file or directory (expected \"byte\", "
                        "a tokenizer.json file, or a directory holding one)", o->tokenizer);
  return CT_OK;
}

ct_status ct_cmd_prepare(int argc, char **argv) {
  prepare_opts o = {.out_dir = "data/fortunes", .tokenizer = "byte", .val_every = 20};
  if (!(o.files = ct_malloc(sizeof *o.files * (size_t)(argc > 0 ? argc : 1), "prepare arguments")))
    return CT_ERR_NOMEM;
  ct_status st = parse_args(argc, argv, &o);
  if (st != CT_OK || o.help) {
    if (o.help) fputs(usage_text, stdout);
    free(o.files);
    return st;
  }
  const char *out_dir = o.out_dir, *tokenizer = o.tokenizer;
  long val_every = o.val_every;

  double t0 = ct_now();
  input_list inputs = {0};
  prep p = {.val_every = val_every};
  ct_tokenizer *tok = NULL;
  char path[2][4096];
  const char *split_name[2] = {"train", "val"};
  char *text = NULL;
  int shown = 0; /* a progress line is on the terminal and needs its newline */

  CT_TRY_GOTO(ct_tokenizer_load(tokenizer, &tok), done);
  if (ct_tokenizer_eot_id(tok) < 0) {
    st = ct_set_error(CT_ERR_INPUT, "%s: the tokenizer has no end-of-text token (an added token such as "
                      "<|endoftext|> or </s>) to end documents with", ct_tokenizer_path(tok));
    goto done;
  }
  p.tok = tok, p.eot = ct_tokenizer_eot_id(tok);
  if (o.n_files == 0) CT_TRY_GOTO(list_fortunes_dir(&inputs), done);
  else CT_TRY_GOTO(list_args(o.n_files, o.files, &inputs), done);

  CT_TRY_GOTO(ct_mkdirs(out_dir), done);
  for (int s = 0; s < 2; s++) {
    if (snprintf(path[s], sizeof path[s], "%s/%s.h5", out_dir, split_name[s]) >= (int)sizeof path[s]) {
      st = ct_set_error(CT_ERR_USAGE, "prepare: --out-dir path too long");
      goto done;
    }
    CT_TRY_GOTO(ct_token_writer_create(path[s], ct_tokenizer_vocab_size(tok), p.eot, ct_tokenizer_digest(tok),
                                       &p.w[s]), done);
  }

  bool tty = isatty(STDERR_FILENO);
  double last = 0;
  int64_t bytes = 0;
  for (int f = 0; f < inputs.n; f++) {
    size_t len = 0;
    CT_TRY_GOTO(ct_read_file(inputs.v[f].path, &text, &len), done);
    if (inputs.v[f].fortune) st = emit_fortunes(&p, text, len);
    else st = emit_doc(&p, text, len);
    free(text);
    text = NULL;
    if (st != CT_OK) {
      ct_add_context(st, "%s: ", inputs.v[f].path);
      goto done;
    }
    bytes += (int64_t)len;
    shown |= progress_update(tty, &last, f + 1 == inputs.n && shown, f + 1, inputs.n, bytes,
                             p.s[0].tokens + p.s[1].tokens);
  }
  if (shown) fputc('\n', stderr);
  shown = 0;
  if (p.doc_index == 0) {
    st = ct_set_error(CT_ERR_INPUT, "prepare: the inputs hold no documents (%d file%s, all empty)",
                      inputs.n, inputs.n == 1 ? "" : "s");
    goto done;
  }
  for (int s = 0; s < 2; s++) {
    st = ct_token_writer_close(p.w[s]);
    p.w[s] = NULL;
    if (st != CT_OK) goto done;
  }
  printf("prepare: %d file%s, %.1f MB, %" PRId64 " documents, tokenizer %s, val every %ld, %.2f s\n",
         inputs.n, inputs.n == 1 ? "" : "s", (double)bytes / 1e6, p.doc_index, tokenizer, val_every,
         ct_now() - t0);
  if (strcmp(tokenizer, "byte") != 0)
    printf("tokenizer: %s, vocab %" PRId64 ", end-of-text id %d, %s\n", ct_tokenizer_path(tok),
           ct_tokenizer_vocab_size(tok), p.eot, ct_tokenizer_digest(tok));
  for (int s = 0; s < 2; s++)
    printf("%-6s %" PRId64 " docs, %" PRId64 " tokens -> %s\n", s ? "val:" : "train:", p.s[s].docs,
           p.s[s].tokens, path[s]);
  if (p.s[0].docs == 0)
    ct_log_warn("prepare: the train split is empty (%" PRId64 " document%s, --val-every %ld)", p.doc_index,
                p.doc_index == 1 ? "" : "s", val_every);
  fflush(stdout);
done:
  if (shown) fputc('\n', stderr);
  free(text);
  for (int s = 0; s < 2; s++) ct_token_writer_abort(p.w[s]);
  ct_tokenizer_destroy(tok);
  list_free(&inputs);
  free(o.files);
  return st;
}

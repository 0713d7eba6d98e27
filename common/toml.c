/* common/toml.c — the TOML 1.0 parser declared in toml.h.
 *
 * One recursive-descent pass over the bytes, with a cursor that tracks line and column for
 * messages. The tree is built as it is read. TOML's rules on what may be added to a table later
 * (a [header] may define a table that a longer header created, dotted keys may extend only
 * tables that dotted keys created, inline tables and array values are closed) depend on how each
 * table or array came to exist, so every node carries that beside the public value.
 *
 * Lookups scan a table's entries in order: O(keys) per lookup, so O(keys^2) to build a table.
 * Fine for config files; a table with many thousands of keys would want a hash.
 */
#include "common/toml.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

/* Arrays and inline tables nested deeper than this are refused: it bounds the recursion. */
enum { MAX_DEPTH = 128 };

/* ------------------------------------------------------------------------------------ nodes */

typedef enum origin {
  ORIGIN_VALUE,    /* a scalar, or the root */
  ORIGIN_IMPLICIT, /* table created as a prefix of a [header] (or by an override) */
  ORIGIN_HEADER,   /* table defined by [header], or one element of [[header]] */
  ORIGIN_DOTTED,   /* table created by a dotted key: only more dotted keys may extend it */
  ORIGIN_INLINE,   /* inline table {...}: closed once written */
  ORIGIN_ARRAY,    /* array written as a value [...]: closed once written */
  ORIGIN_AOT,      /* array of tables built by [[header]]: later [[header]]s append to it */
} origin;

/* The public value is the first member, so a ct_toml_value * from this file is a node * and
 * free(v) frees the node. Origins are read only while parsing, on nodes the parser made. */
typedef struct node {
  ct_toml_value v;
  origin how;
} node;

static origin origin_of(const ct_toml_value *v) { return ((const node *)v)->how; }
static void set_origin(ct_toml_value *v, origin how) { ((node *)v)->how = how; }

static ct_toml_value *node_new(ct_toml_type type, int line, int col, origin how) {
  node *n = ct_calloc(1, sizeof *n, "TOML value");
  if (!n) return NULL;
  n->v.type = type;
  n->v.line = line;
  n->v.col = col;
  n->how = how;
  return &n->v;
}

void ct_toml_free(ct_toml_value *v) {
  if (!v) return;
  switch (v->type) {
    case CT_TOML_TABLE:
      for (int i = 0; i < v->u.table.n; i++) {
        free(v->u.table.items[i].key);
        ct_toml_free(v->u.table.items[i].value);
      }
      free(v->u.table.items);
      break;
    case CT_TOML_ARRAY:
      for (int i = 0; i < v->u.array.n; i++) ct_toml_free(v->u.array.items[i]);
      free(v->u.array.items);
      break;
    case CT_TOML_STRING:
    case CT_TOML_DATETIME:
      free(v->u.s);
      break;
    default:
      break;
  }
  free(v);
}

static ct_status nomem(void) {
  return ct_set_error(CT_ERR_NOMEM, "out of memory building a TOML document");
}

/* Appends key -> v. Takes ownership of both, and frees them if it fails (either may be NULL from a
 * failed allocation, which reports CT_ERR_NOMEM), so callers can pass ct_strdup(...) directly. */
static ct_status table_add(ct_toml_value *t, char *key, ct_toml_value *v) {
  if (!key || !v) goto fail;
  if (t->u.table.n == t->u.table.cap) {
    int cap = t->u.table.cap ? 2 * t->u.table.cap : 8;
    ct_toml_entry *items = realloc(t->u.table.items, (size_t)cap * sizeof *items);
    if (!items) goto fail;
    t->u.table.items = items;
    t->u.table.cap = cap;
  }
  t->u.table.items[t->u.table.n++] = (ct_toml_entry){key, v, v->line, v->col};
  return CT_OK;
fail:
  free(key);
  ct_toml_free(v);
  return nomem();
}

/* Same contract as table_add. */
static ct_status array_push(ct_toml_value *a, ct_toml_value *v) {
  if (!v) return nomem();
  if (a->u.array.n == a->u.array.cap) {
    int cap = a->u.array.cap ? 2 * a->u.array.cap : 8;
    ct_toml_value **items = realloc(a->u.array.items, (size_t)cap * sizeof *items);
    if (!items) {
      ct_toml_free(v);
      return nomem();
    }
    a->u.array.items = items;
    a->u.array.cap = cap;
  }
  a->u.array.items[a->u.array.n++] = v;
  return CT_OK;
}

/* The entry whose key is the n bytes at `key`; NULL if absent or `t` is not a table. */
static ct_toml_entry *find_entry(const ct_toml_value *t, const char *key, size_t n) {
  if (!t || t->type != CT_TOML_TABLE) return NULL;
  for (int i = 0; i < t->u.table.n; i++) {
    ct_toml_entry *e = &t->u.table.items[i];
    if (strncmp(e->key, key, n) == 0 && e->key[n] == '\0') return e;
  }
  return NULL;
}

ct_toml_value *ct_toml_get(const ct_toml_value *table, const char *key) {
  ct_toml_entry *e = find_entry(table, key, strlen(key));
  return e ? e->value : NULL;
}

ct_toml_value *ct_toml_get_path(const ct_toml_value *root, const char *path) {
  const ct_toml_value *v = root;
  for (const char *s = path;;) {
    const char *dot = strchr(s, '.');
    ct_toml_entry *e = find_entry(v, s, dot ? (size_t)(dot - s) : strlen(s));
    if (!e) return NULL;
    if (!dot) return e->value;
    v = e->value;
    s = dot + 1;
  }
}

const char *ct_toml_type_name(ct_toml_type t) {
  switch (t) {
    case CT_TOML_TABLE: return "table";
    case CT_TOML_ARRAY: return "array";
    case CT_TOML_STRING: return "string";
    case CT_TOML_INT: return "integer";
    case CT_TOML_FLOAT: return "float";
    case CT_TOML_BOOL: return "boolean";
    case CT_TOML_DATETIME: return "datetime";
  }
  return "unknown";
}

/* How `v` was defined, for messages: "by dotted keys", "as an inline table", ... */
static const char *defined_as(const ct_toml_value *v, char *buf, size_t size) {
  switch (origin_of(v)) {
    case ORIGIN_IMPLICIT: return "implicitly by a [table] header";
    case ORIGIN_HEADER: return "by a [table] header";
    case ORIGIN_DOTTED: return "by dotted keys";
    case ORIGIN_INLINE: return "as an inline table";
    case ORIGIN_ARRAY: return "as an array value";
    case ORIGIN_AOT: return "as an array of tables";
    case ORIGIN_VALUE: break;
  }
  snprintf(buf, size, "as a value of type %s", ct_toml_type_name(v->type));
  return buf;
}

/* ----------------------------------------------------------------------------------- cursor */

typedef struct loc { int line, col; } loc;

typedef struct parser {
  const char *p, *end;    /* cursor and end of input */
  const char *line_start; /* first byte of the cursor's line; the column counts bytes from it */
  int line;               /* 1-based line of the cursor */
  const char *file;       /* for messages; NULL for override text ("column N: ...") */
  int depth;              /* arrays and inline tables open around the cursor */
  bool synthetic;         /* values get line/col 0,0: the text came from an override */
} parser;

static parser parser_over(const char *src, size_t len, const char *file) {
  return (parser){.p = src, .end = src + len, .line_start = src, .line = 1, .file = file};
}

/* The byte k ahead of the cursor, or -1 past the end. */
static int peek_at(const parser *ps, size_t k) {
  return (size_t)(ps->end - ps->p) > k ? (unsigned char)ps->p[k] : -1;
}
static int peek(const parser *ps) { return peek_at(ps, 0); }

static void adv(parser *ps) {
  if (*ps->p == '\n') {
    ps->line++;
    ps->line_start = ps->p + 1;
  }
  ps->p++;
}
static void adv_n(parser *ps, size_t n) {
  while (n-- > 0) adv(ps);
}
static bool eat(parser *ps, int c) {
  if (peek(ps) != c) return false;
  adv(ps);
  return true;
}
static bool looking_at(const parser *ps, const char *s) {
  size_t n = strlen(s);
  return (size_t)(ps->end - ps->p) >= n && memcmp(ps->p, s, n) == 0;
}
static loc here(const parser *ps) { return (loc){ps->line, (int)(ps->p - ps->line_start) + 1}; }

static bool is_ws(int c) { return c == ' ' || c == '\t'; }
static bool is_digit(int c) { return c >= '0' && c <= '9'; }
static bool is_bare(int c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_' || c == '-';
}
/* Control characters TOML refuses in strings and comments (tab is allowed). */
static bool is_ctrl(int c) { return (c >= 0 && c < 0x20 && c != '\t') || c == 0x7f; }
static bool at_newline(const parser *ps) {
  return peek(ps) == '\n' || (peek(ps) == '\r' && peek_at(ps, 1) == '\n');
}
static void eat_newline(parser *ps) {
  if (peek(ps) == '\r') adv(ps);
  adv(ps);
}
static void skip_ws(parser *ps) {
  while (is_ws(peek(ps))) adv(ps);
}

/* ----------------------------------------------------------------------------------- errors */

static ct_status perr(const parser *ps, loc at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ct_status perr(const parser *ps, loc at, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (!ps->file) return ct_set_error(CT_ERR_CONFIG, "column %d: %s", at.col, msg);
  return ct_set_error(CT_ERR_CONFIG, "%s:%d:%d: %s", ps->file, at.line, at.col, msg);
}

/* "expected WHAT, found X" at the cursor, X describing what is there. */
static ct_status expected(const parser *ps, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static ct_status expected(const parser *ps, const char *fmt, ...) {
  char what[512], found[32];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  int c = peek(ps);
  if (c < 0) snprintf(found, sizeof found, "end of input");
  else if (at_newline(ps)) snprintf(found, sizeof found, "end of line");
  else if (c >= 0x20 && c < 0x7f) snprintf(found, sizeof found, "'%c'", c);
  else snprintf(found, sizeof found, "byte 0x%02x", c);
  return perr(ps, here(ps), "expected %s, found %s", what, found);
}

/* --------------------------------------------------------------------- comments and blanks */

static ct_status skip_comment(parser *ps) {
  if (peek(ps) != '#') return CT_OK;
  for (adv(ps); ps->p < ps->end && !at_newline(ps); adv(ps))
    if (is_ctrl(peek(ps)))
      return perr(ps, here(ps), "control character 0x%02x in a comment", peek(ps));
  return CT_OK;
}

/* Whitespace, comments and newlines: between statements and inside arrays. */
static ct_status skip_blank(parser *ps) {
  for (;;) {
    skip_ws(ps);
    CT_TRY(skip_comment(ps));
    if (!at_newline(ps)) return CT_OK;
    eat_newline(ps);
  }
}

/* After a key/value pair or a header only whitespace and a comment may follow on the line. */
static ct_status end_of_line(parser *ps, const char *after) {
  skip_ws(ps);
  CT_TRY(skip_comment(ps));
  if (ps->p == ps->end) return CT_OK;
  if (!at_newline(ps)) return expected(ps, "end of line after %s", after);
  eat_newline(ps);
  return CT_OK;
}

/* ---------------------------------------------------------------------------------- strings */

typedef struct sbuf { char *d; size_t n, cap; } sbuf;

static ct_status sb_put(sbuf *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 32;
    while (cap < b->n + n + 1) cap *= 2;
    char *d = realloc(b->d, cap);
    if (!d) return nomem();
    b->d = d;
    b->cap = cap;
  }
  memcpy(b->d + b->n, s, n);
  b->n += n;
  b->d[b->n] = '\0';
  return CT_OK;
}
static ct_status sb_putc(sbuf *b, int c) {
  char ch = (char)c;
  return sb_put(b, &ch, 1);
}
/* Hands the NUL-terminated text to the caller ("" when nothing was put). */
static ct_status sb_take(sbuf *b, char **out) {
  if (!b->d) CT_TRY(sb_put(b, "", 0));
  *out = b->d;
  *b = (sbuf){0};
  return CT_OK;
}

static char *dup_n(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (!d) return NULL;
  memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

static ct_status put_utf8(sbuf *b, uint32_t cp) {
  char s[4];
  size_t n;
  if (cp < 0x80) {
    s[0] = (char)cp, n = 1;
  } else if (cp < 0x800) {
    s[0] = (char)(0xC0 | cp >> 6), s[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
  } else if (cp < 0x10000) {
    s[0] = (char)(0xE0 | cp >> 12), s[1] = (char)(0x80 | (cp >> 6 & 0x3F));
    s[2] = (char)(0x80 | (cp & 0x3F)), n = 3;
  } else {
    s[0] = (char)(0xF0 | cp >> 18), s[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    s[2] = (char)(0x80 | (cp >> 6 & 0x3F)), s[3] = (char)(0x80 | (cp & 0x3F)), n = 4;
  }
  return sb_put(b, s, n);
}

/* The value of c as a digit in `base`, or -1. */
static int digit_val(int c, int base) {
  int d = is_digit(c) ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10
        : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : 99;
  return d < base ? d : -1;
}

/* One escape sequence of a basic string; the cursor is on the backslash. */
static ct_status parse_escape(parser *ps, sbuf *b) {
  loc at = here(ps);
  adv(ps);
  int c = peek(ps);
  switch (c) {
    case 'b': adv(ps); return sb_putc(b, '\b');
    case 't': adv(ps); return sb_putc(b, '\t');
    case 'n': adv(ps); return sb_putc(b, '\n');
    case 'f': adv(ps); return sb_putc(b, '\f');
    case 'r': adv(ps); return sb_putc(b, '\r');
    case '"': adv(ps); return sb_putc(b, '"');
    case '\\': adv(ps); return sb_putc(b, '\\');
    case 'u':
    case 'U': {
      int n = c == 'u' ? 4 : 8;
      uint32_t cp = 0;
      adv(ps);
      for (int i = 0; i < n; i++, adv(ps)) {
        int h = digit_val(peek(ps), 16);
        if (h < 0) return perr(ps, at, "invalid escape: \\%c needs %d hex digits", c, n);
        cp = cp << 4 | (uint32_t)h;
      }
      if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return perr(ps, at, "invalid escape: U+%X is not a Unicode scalar value", (unsigned)cp);
      /* Values are NUL-terminated C strings; a NUL would silently cut them short. */
      if (cp == 0) return perr(ps, at, "invalid escape: U+0000 cannot be stored in a string");
      return put_utf8(b, cp);
    }
    default:
      if (c >= 0x20 && c < 0x7f)
        return perr(ps, at, "invalid escape '\\%c' (valid: \\b \\t \\n \\f \\r \\\" \\\\ \\uXXXX "
                    "\\UXXXXXXXX)", c);
      return perr(ps, at, "invalid escape: '\\' followed by %s",
                  c < 0 ? "end of input" : at_newline(ps) ? "end of line" : "a non-printing byte");
  }
}

/* In a multi-line basic string, a backslash that ends a line (trailing blanks allowed) joins it
 * to the next non-blank text. Consumes that and returns true; false if it is an escape. */
static bool skip_line_continuation(parser *ps) {
  size_t k = 1;
  while (is_ws(peek_at(ps, k))) k++;
  int c = peek_at(ps, k);
  if (!(c == '\n' || (c == '\r' && peek_at(ps, k + 1) == '\n'))) return false;
  adv_n(ps, k);
  for (;;) {
    if (is_ws(peek(ps))) adv(ps);
    else if (at_newline(ps)) eat_newline(ps);
    else return true;
  }
}

/* A string of any of the four kinds; the cursor is on the opening quote. Keys may not be
 * multi-line (allow_multiline = false). CRLF inside a multi-line string becomes "\n". */
static ct_status parse_string(parser *ps, bool allow_multiline, char **out) {
  loc at = here(ps);
  int q = peek(ps);
  bool literal = q == '\'';
  bool ml = peek_at(ps, 1) == q && peek_at(ps, 2) == q;
  sbuf b = {0};
  ct_status st = CT_OK;
  if (ml && !allow_multiline) return perr(ps, at, "a multi-line string cannot be a key");
  adv_n(ps, ml ? 3 : 1);
  if (ml && at_newline(ps)) eat_newline(ps); /* a newline right after the opening is trimmed */
  for (;;) {
    int c = peek(ps);
    if (c < 0 || (!ml && at_newline(ps))) {
      st = perr(ps, at, "unterminated string: no closing %s before end of %s",
                ml ? (literal ? "'''" : "\"\"\"") : (literal ? "'" : "\""), ml ? "input" : "line");
      goto fail;
    }
    if (c == q) {
      if (!ml) {
        adv(ps);
        break;
      }
      if (peek_at(ps, 1) == q && peek_at(ps, 2) == q) {
        /* up to two quotes may sit just before the closing three: """a""""" is a"" */
        size_t extra = 0;
        while (extra < 2 && peek_at(ps, 3 + extra) == q) extra++;
        CT_TRY_GOTO(sb_put(&b, ps->p, extra), fail);
        adv_n(ps, 3 + extra);
        break;
      }
    } else if (c == '\\' && !literal) {
      if (ml && skip_line_continuation(ps)) continue;
      CT_TRY_GOTO(parse_escape(ps, &b), fail);
      continue;
    } else if (ml && at_newline(ps)) {
      eat_newline(ps);
      CT_TRY_GOTO(sb_putc(&b, '\n'), fail);
      continue;
    } else if (is_ctrl(c)) {
      st = perr(ps, here(ps), "control character 0x%02x in a string%s", c,
                literal ? "" : " (write it as an escape)");
      goto fail;
    }
    CT_TRY_GOTO(sb_putc(&b, c), fail);
    adv(ps);
  }
  CT_TRY_GOTO(sb_take(&b, out), fail);
  return CT_OK;
fail:
  free(b.d);
  return st;
}

/* --------------------------------------------------------------------------------------- keys */

typedef struct keyseg { char *s; loc at; } keyseg;
typedef struct keypath { keyseg *seg; int n, cap; } keypath;

static void keypath_free(keypath *k) {
  for (int i = 0; i < k->n; i++) free(k->seg[i].s);
  free(k->seg);
  *k = (keypath){0};
}

/* Segments 0..upto joined with '.', for messages. */
static const char *keypath_text(const keypath *k, int upto, char *buf, size_t size) {
  size_t n = 0;
  buf[0] = '\0';
  for (int i = 0; i <= upto && n < size; i++)
    n += (size_t)snprintf(buf + n, size - n, "%s%s", i ? "." : "", k->seg[i].s);
  return buf;
}

/* A dotted key: bare or quoted segments separated by '.', blanks around the dots ignored.
 * Leaves the cursor after the blanks that follow the key. On failure the caller frees *k. */
static ct_status parse_key(parser *ps, keypath *k) {
  for (;;) {
    skip_ws(ps);
    loc at = here(ps);
    int c = peek(ps);
    char *s;
    if (c == '"' || c == '\'') {
      CT_TRY(parse_string(ps, false, &s));
    } else if (is_bare(c)) {
      const char *start = ps->p;
      while (is_bare(peek(ps))) adv(ps);
      if (!(s = dup_n(start, (size_t)(ps->p - start)))) return nomem();
    } else {
      return expected(ps, "a key (letters, digits, '_', '-' or a quoted string)");
    }
    if (k->n == k->cap) {
      int cap = k->cap ? 2 * k->cap : 4;
      keyseg *seg = realloc(k->seg, (size_t)cap * sizeof *seg);
      if (!seg) {
        free(s);
        return nomem();
      }
      k->seg = seg;
      k->cap = cap;
    }
    k->seg[k->n++] = (keyseg){s, at};
    skip_ws(ps);
    if (!eat(ps, '.')) return CT_OK;
  }
}

/* ------------------------------------------------------------------------------------- values */

static ct_status parse_value(parser *ps, ct_toml_value **out);
static ct_status parse_keyval(parser *ps, ct_toml_value *table);

static ct_status new_value(const parser *ps, ct_toml_type type, loc at, origin how,
                           ct_toml_value **out) {
  if (ps->synthetic) at = (loc){0, 0};
  *out = node_new(type, at.line, at.col, how);
  return *out ? CT_OK : CT_ERR_NOMEM; /* ct_calloc recorded the message */
}

/* Digits in `base` with '_' allowed only between two digits; appends them, without the '_'s. */
static ct_status scan_digits(parser *ps, sbuf *b, int base, const char *what) {
  if (digit_val(peek(ps), base) < 0) return expected(ps, "%s", what);
  for (;;) {
    int c = peek(ps);
    if (digit_val(c, base) >= 0) {
      CT_TRY(sb_putc(b, c));
      adv(ps);
    } else if (c == '_') {
      if (digit_val(peek_at(ps, 1), base) < 0)
        return perr(ps, here(ps), "invalid number: '_' must sit between two digits");
      adv(ps);
    } else {
      return CT_OK;
    }
  }
}

/* Converts digits (no sign, no '_') to an int64, refusing what does not fit. */
static ct_status make_int(parser *ps, loc at, const char *digits, int base, bool neg,
                          ct_toml_value **out) {
  uint64_t acc = 0, limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
  for (const char *d = digits; *d; d++) {
    uint64_t v = (uint64_t)digit_val(*d, base);
    if (acc > (limit - v) / (uint64_t)base)
      return perr(ps, at, "invalid number: integer does not fit in 64 bits");
    acc = acc * (uint64_t)base + v;
  }
  CT_TRY(new_value(ps, CT_TOML_INT, at, ORIGIN_VALUE, out));
  (*out)->u.i = !neg ? (int64_t)acc : acc == limit ? INT64_MIN : -(int64_t)acc;
  return CT_OK;
}

/* Integers (decimal with sign, 0x/0o/0b without) and floats (fraction, exponent, inf, nan). */
static ct_status parse_number(parser *ps, ct_toml_value **out) {
  loc at = here(ps);
  const char *start = ps->p;
  bool neg = peek(ps) == '-';
  sbuf b = {0}; /* the number without '_', as strtod reads it */
  ct_status st = CT_OK;
  if (peek(ps) == '+' || peek(ps) == '-') adv(ps);
  if (looking_at(ps, "inf") || looking_at(ps, "nan")) {
    double f = peek(ps) == 'i' ? INFINITY : NAN;
    adv_n(ps, 3);
    CT_TRY(new_value(ps, CT_TOML_FLOAT, at, ORIGIN_VALUE, out));
    (*out)->u.f = copysign(f, neg ? -1.0 : 1.0);
    return CT_OK;
  }
  int x = peek_at(ps, 1);
  if (peek(ps) == '0' && (x == 'x' || x == 'o' || x == 'b')) {
    int base = x == 'x' ? 16 : x == 'o' ? 8 : 2;
    if (ps->p != start) {
      st = perr(ps, at, "invalid number: hex, octal and binary integers take no sign");
      goto done;
    }
    adv_n(ps, 2);
    const char *what = base == 16 ? "a hex digit after '0x'"
                       : base == 8 ? "an octal digit after '0o'" : "a binary digit after '0b'";
    CT_TRY_GOTO(scan_digits(ps, &b, base, what), done);
    st = make_int(ps, at, b.d, base, false, out);
    goto done;
  }
  if (neg) CT_TRY_GOTO(sb_putc(&b, '-'), done);
  size_t int_start = b.n;
  CT_TRY_GOTO(scan_digits(ps, &b, 10, "a digit"), done);
  if (b.n - int_start > 1 && b.d[int_start] == '0') {
    st = perr(ps, at, "invalid number: leading zeros are not allowed");
    goto done;
  }
  bool is_float = false;
  if (eat(ps, '.')) {
    is_float = true;
    CT_TRY_GOTO(sb_putc(&b, '.'), done);
    CT_TRY_GOTO(scan_digits(ps, &b, 10, "a digit after '.'"), done);
  }
  if (eat(ps, 'e') || eat(ps, 'E')) {
    is_float = true;
    CT_TRY_GOTO(sb_putc(&b, 'e'), done);
    if (peek(ps) == '+' || peek(ps) == '-') {
      CT_TRY_GOTO(sb_putc(&b, peek(ps)), done);
      adv(ps);
    }
    CT_TRY_GOTO(scan_digits(ps, &b, 10, "a digit in the exponent"), done); /* leading 0s allowed */
  }
  if (!is_float) {
    st = make_int(ps, at, b.d + int_start, 10, neg, out);
    goto done;
  }
  double f = strtod(b.d, NULL); /* plain C-locale syntax by now */
  if (isinf(f)) {
    st = perr(ps, at, "invalid number: float out of range");
    goto done;
  }
  CT_TRY_GOTO(new_value(ps, CT_TOML_FLOAT, at, ORIGIN_VALUE, out), done);
  (*out)->u.f = f;
done:
  free(b.d);
  return st;
}

/* Exactly n digits as a number; false (consuming nothing) if they are not there. */
static bool read_fixed(parser *ps, int n, int *val) {
  int v = 0;
  for (int i = 0; i < n; i++) {
    int c = peek_at(ps, (size_t)i);
    if (!is_digit(c)) return false;
    v = v * 10 + c - '0';
  }
  adv_n(ps, (size_t)n);
  *val = v;
  return true;
}

/* HH:MM:SS with an optional fraction. */
static ct_status parse_time(parser *ps, loc at) {
  int h, m, s;
  if (!read_fixed(ps, 2, &h) || !eat(ps, ':') || !read_fixed(ps, 2, &m) || !eat(ps, ':') ||
      !read_fixed(ps, 2, &s))
    return expected(ps, "a time HH:MM:SS");
  if (h > 23 || m > 59 || s > 60) /* 60: a leap second */
    return perr(ps, at, "invalid time: %02d:%02d:%02d is out of range", h, m, s);
  if (eat(ps, '.')) {
    if (!is_digit(peek(ps))) return expected(ps, "a digit after '.' in the time");
    while (is_digit(peek(ps))) adv(ps);
  }
  return CT_OK;
}

static int days_in_month(int y, int m) {
  static const int days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  bool leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
  return m == 2 && leap ? 29 : days[m - 1];
}

/* Offset date-time, local date-time, local date or local time; checked, then kept as text. */
static ct_status parse_datetime(parser *ps, ct_toml_value **out) {
  loc at = here(ps);
  const char *start = ps->p;
  if (peek_at(ps, 4) == '-') {
    int y, mo, d;
    if (!read_fixed(ps, 4, &y) || !eat(ps, '-') || !read_fixed(ps, 2, &mo) || !eat(ps, '-') ||
        !read_fixed(ps, 2, &d))
      return expected(ps, "a date YYYY-MM-DD");
    if (mo < 1 || mo > 12 || d < 1 || d > days_in_month(y, mo))
      return perr(ps, at, "invalid date: %04d-%02d-%02d does not exist", y, mo, d);
    int c = peek(ps);
    /* a space may separate date and time, but only when a time follows ("d = 2024-01-01 # x") */
    bool space_time = c == ' ' && is_digit(peek_at(ps, 1)) && is_digit(peek_at(ps, 2)) &&
                      peek_at(ps, 3) == ':';
    if (c == 'T' || c == 't' || space_time) {
      adv(ps);
      CT_TRY(parse_time(ps, at));
      c = peek(ps);
      if (c == 'Z' || c == 'z') {
        adv(ps);
      } else if (c == '+' || c == '-') {
        int oh, om;
        adv(ps);
        if (!read_fixed(ps, 2, &oh) || !eat(ps, ':') || !read_fixed(ps, 2, &om))
          return expected(ps, "a UTC offset +HH:MM");
        if (oh > 23 || om > 59) return perr(ps, at, "invalid date-time: UTC offset out of range");
      }
    }
  } else {
    CT_TRY(parse_time(ps, at));
  }
  char *s = dup_n(start, (size_t)(ps->p - start));
  if (!s) return nomem();
  if (new_value(ps, CT_TOML_DATETIME, at, ORIGIN_VALUE, out) != CT_OK) {
    free(s);
    return CT_ERR_NOMEM;
  }
  (*out)->u.s = s;
  return CT_OK;
}

static ct_status parse_array(parser *ps, ct_toml_value **out) {
  loc at = here(ps);
  ct_toml_value *arr, *item;
  ct_status st = CT_OK;
  if (ps->depth >= MAX_DEPTH)
    return perr(ps, at, "arrays and inline tables nested more than %d deep", MAX_DEPTH);
  CT_TRY(new_value(ps, CT_TOML_ARRAY, at, ORIGIN_ARRAY, &arr));
  ps->depth++;
  adv(ps);
  for (;;) {
    CT_TRY_GOTO(skip_blank(ps), fail);
    if (eat(ps, ']')) break;
    CT_TRY_GOTO(parse_value(ps, &item), fail);
    CT_TRY_GOTO(array_push(arr, item), fail);
    CT_TRY_GOTO(skip_blank(ps), fail);
    if (eat(ps, ']')) break;
    if (!eat(ps, ',')) {
      st = expected(ps, "',' or ']' in the array opened at %d:%d", at.line, at.col);
      goto fail;
    }
  }
  ps->depth--;
  *out = arr;
  return CT_OK;
fail:
  ct_toml_free(arr);
  return st;
}

/* { k = v, ... } on one line, no trailing comma; closed to later additions (ORIGIN_INLINE). */
static ct_status parse_inline_table(parser *ps, ct_toml_value **out) {
  loc at = here(ps);
  ct_toml_value *t;
  ct_status st = CT_OK;
  if (ps->depth >= MAX_DEPTH)
    return perr(ps, at, "arrays and inline tables nested more than %d deep", MAX_DEPTH);
  CT_TRY(new_value(ps, CT_TOML_TABLE, at, ORIGIN_INLINE, &t));
  ps->depth++;
  adv(ps);
  skip_ws(ps);
  if (!eat(ps, '}')) {
    for (;;) {
      CT_TRY_GOTO(parse_keyval(ps, t), fail);
      skip_ws(ps);
      if (eat(ps, '}')) break;
      if (!eat(ps, ',')) {
        st = expected(ps, "',' or '}' in the inline table opened at %d:%d (it must fit on one "
                      "line)", at.line, at.col);
        goto fail;
      }
      skip_ws(ps);
      if (peek(ps) == '}') {
        st = perr(ps, here(ps), "a trailing comma is not allowed in an inline table");
        goto fail;
      }
    }
  }
  ps->depth--;
  *out = t;
  return CT_OK;
fail:
  ct_toml_free(t);
  return st;
}

/* Any value; the cursor is on its first byte. *out is written only on success. */
static ct_status parse_value(parser *ps, ct_toml_value **out) {
  loc at = here(ps);
  int c = peek(ps);
  if (c == '"' || c == '\'') {
    char *s;
    CT_TRY(parse_string(ps, true, &s));
    if (new_value(ps, CT_TOML_STRING, at, ORIGIN_VALUE, out) != CT_OK) {
      free(s);
      return CT_ERR_NOMEM;
    }
    (*out)->u.s = s;
    return CT_OK;
  }
  if (c == '[') return parse_array(ps, out);
  if (c == '{') return parse_inline_table(ps, out);
  if (looking_at(ps, "true") || looking_at(ps, "false")) {
    bool b = c == 't';
    adv_n(ps, b ? 4 : 5);
    CT_TRY(new_value(ps, CT_TOML_BOOL, at, ORIGIN_VALUE, out));
    (*out)->u.b = b;
    return CT_OK;
  }
  if (is_digit(c)) {
    /* 4 digits then '-' start a date, 2 digits then ':' a time; no number looks like either */
    size_t k = 0;
    while (is_digit(peek_at(ps, k))) k++;
    if ((k == 4 && peek_at(ps, 4) == '-') || (k == 2 && peek_at(ps, 2) == ':'))
      return parse_datetime(ps, out);
  }
  if (is_digit(c) || c == '+' || c == '-' || looking_at(ps, "inf") || looking_at(ps, "nan"))
    return parse_number(ps, out);
  return expected(ps, "a value (string, number, boolean, date-time, array or inline table)");
}

/* -------------------------------------------------------------------------- keys into tables */

/* Steps from *t into segment i of a dotted key `a.b.c = v`, creating the table if absent. Only
 * tables that dotted keys created may be extended this way. */
static ct_status descend_dotted(parser *ps, ct_toml_value **t, const keypath *k, int i) {
  char name[256], how[64];
  ct_toml_value *v = ct_toml_get(*t, k->seg[i].s);
  if (!v) {
    CT_TRY(new_value(ps, CT_TOML_TABLE, k->seg[i].at, ORIGIN_DOTTED, &v));
    CT_TRY(table_add(*t, ct_strdup(k->seg[i].s), v));
  } else if (v->type != CT_TOML_TABLE || origin_of(v) != ORIGIN_DOTTED) {
    return perr(ps, k->seg[i].at, "cannot add keys to '%s' with a dotted key: it is defined %s at "
                "%d:%d", keypath_text(k, i, name, sizeof name), defined_as(v, how, sizeof how),
                v->line, v->col);
  }
  *t = v;
  return CT_OK;
}

/* Steps from *t into segment i of a [header] path, creating an implicit table if absent; an
 * array of tables is entered at its last element. */
static ct_status descend_header(parser *ps, ct_toml_value **t, const keypath *k, int i) {
  char name[256], how[64];
  ct_toml_value *v = ct_toml_get(*t, k->seg[i].s);
  if (!v) {
    CT_TRY(new_value(ps, CT_TOML_TABLE, k->seg[i].at, ORIGIN_IMPLICIT, &v));
    CT_TRY(table_add(*t, ct_strdup(k->seg[i].s), v));
  } else if (v->type == CT_TOML_ARRAY && origin_of(v) == ORIGIN_AOT) {
    v = v->u.array.items[v->u.array.n - 1];
  } else if (v->type != CT_TOML_TABLE || origin_of(v) == ORIGIN_INLINE) {
    return perr(ps, k->seg[i].at, "cannot add a table under '%s': it is defined %s at %d:%d",
                keypath_text(k, i, name, sizeof name), defined_as(v, how, sizeof how), v->line,
                v->col);
  }
  *t = v;
  return CT_OK;
}

/* key = value, into `table` (the current [table], or an inline table being read). */
static ct_status parse_keyval(parser *ps, ct_toml_value *table) {
  keypath k = {0};
  ct_toml_value *t = table, *v;
  char name[256];
  ct_status st = CT_OK;
  CT_TRY_GOTO(parse_key(ps, &k), done);
  if (!eat(ps, '=')) {
    st = expected(ps, "'=' after the key '%s'", keypath_text(&k, k.n - 1, name, sizeof name));
    goto done;
  }
  skip_ws(ps);
  for (int i = 0; i + 1 < k.n; i++) CT_TRY_GOTO(descend_dotted(ps, &t, &k, i), done);
  keyseg *last = &k.seg[k.n - 1];
  const ct_toml_value *dup = ct_toml_get(t, last->s);
  if (dup) {
    st = perr(ps, last->at, "duplicate key '%s' (first defined at %d:%d)",
              keypath_text(&k, k.n - 1, name, sizeof name), dup->line, dup->col);
    goto done;
  }
  CT_TRY_GOTO(parse_value(ps, &v), done);
  st = table_add(t, last->s, v);
  last->s = NULL; /* the table owns it now, or table_add freed it */
  if (st == CT_OK) { /* remember where the key itself was written */
    t->u.table.items[t->u.table.n - 1].line = last->at.line;
    t->u.table.items[t->u.table.n - 1].col = last->at.col;
  }
done:
  keypath_free(&k);
  return st;
}

/* [a.b] or [[a.b]]; makes *cur the table that the following key/value pairs go into. */
static ct_status parse_header(parser *ps, ct_toml_value *root, ct_toml_value **cur) {
  loc at = here(ps);
  bool aot = peek_at(ps, 1) == '[';
  keypath k = {0};
  ct_toml_value *t = root, *v;
  char name[256], how[64];
  ct_status st = CT_OK;
  adv_n(ps, aot ? 2 : 1);
  CT_TRY_GOTO(parse_key(ps, &k), done);
  if (!eat(ps, ']') || (aot && !eat(ps, ']'))) {
    st = expected(ps, "'%s' to close the table header", aot ? "]]" : "]");
    goto done;
  }
  for (int i = 0; i + 1 < k.n; i++) CT_TRY_GOTO(descend_header(ps, &t, &k, i), done);
  keyseg *last = &k.seg[k.n - 1];
  keypath_text(&k, k.n - 1, name, sizeof name);
  v = ct_toml_get(t, last->s);
  if (aot) {
    if (!v) {
      CT_TRY_GOTO(new_value(ps, CT_TOML_ARRAY, at, ORIGIN_AOT, &v), done);
      CT_TRY_GOTO(table_add(t, ct_strdup(last->s), v), done);
    } else if (v->type != CT_TOML_ARRAY || origin_of(v) != ORIGIN_AOT) {
      st = perr(ps, last->at, "cannot make [[%s]] an array of tables: it is defined %s at %d:%d",
                name, defined_as(v, how, sizeof how), v->line, v->col);
      goto done;
    }
    ct_toml_value *elem;
    CT_TRY_GOTO(new_value(ps, CT_TOML_TABLE, at, ORIGIN_HEADER, &elem), done);
    CT_TRY_GOTO(array_push(v, elem), done);
    *cur = elem;
  } else {
    if (!v) {
      CT_TRY_GOTO(new_value(ps, CT_TOML_TABLE, at, ORIGIN_HEADER, &v), done);
      CT_TRY_GOTO(table_add(t, ct_strdup(last->s), v), done);
    } else if (v->type == CT_TOML_TABLE && origin_of(v) == ORIGIN_IMPLICIT) {
      set_origin(v, ORIGIN_HEADER); /* [a.b] then [a]: defining the super-table is allowed */
      v->line = at.line;
      v->col = at.col;
    } else {
      st = perr(ps, last->at, "table [%s] is already defined %s at %d:%d", name,
                defined_as(v, how, sizeof how), v->line, v->col);
      goto done;
    }
    *cur = v;
  }
done:
  keypath_free(&k);
  return st;
}

/* --------------------------------------------------------------------------------- documents */

ct_status ct_toml_parse(const char *src, size_t len, const char *filename, ct_toml_value **root) {
  parser ps = parser_over(src ? src : "", src ? len : 0, filename ? filename : "<toml>");
  ct_toml_value *doc, *cur;
  ct_status st = CT_OK;
  *root = NULL;
  if (looking_at(&ps, "\xEF\xBB\xBF")) ps.p = ps.line_start = ps.p + 3; /* UTF-8 byte-order mark */
  CT_TRY(new_value(&ps, CT_TOML_TABLE, (loc){0, 0}, ORIGIN_VALUE, &doc));
  cur = doc;
  for (;;) {
    CT_TRY_GOTO(skip_blank(&ps), fail);
    if (ps.p == ps.end) break;
    if (peek(&ps) == '[') {
      CT_TRY_GOTO(parse_header(&ps, doc, &cur), fail);
      CT_TRY_GOTO(end_of_line(&ps, "the table header"), fail);
    } else {
      CT_TRY_GOTO(parse_keyval(&ps, cur), fail);
      CT_TRY_GOTO(end_of_line(&ps, "the value"), fail);
    }
  }
  *root = doc;
  return CT_OK;
fail:
  ct_toml_free(doc);
  return st;
}

ct_status ct_toml_parse_file(const char *path, ct_toml_value **root) {
  char *src;
  size_t len;
  *root = NULL;
  CT_TRY(ct_read_file(path, &src, &len));
  ct_status st = ct_toml_parse(src, len, path, root);
  free(src);
  return st;
}

ct_status ct_toml_set_override(ct_toml_value *root, const char *assignment) {
  parser kp = parser_over(assignment, strlen(assignment), NULL);
  keypath k = {0};
  ct_toml_value *t = root, *v = NULL;
  char name[256];
  ct_status st;
  if (!root || root->type != CT_TOML_TABLE)
    return ct_set_error(CT_ERR_USAGE, "override '%s': no table to apply it to", assignment);
  st = parse_key(&kp, &k);
  if (st != CT_OK) {
    keypath_free(&k);
    if (st != CT_ERR_CONFIG) return st;
    return ct_add_context(CT_ERR_USAGE, "override '%s': bad key: ", assignment);
  }
  if (!eat(&kp, '=')) {
    st = ct_set_error(CT_ERR_USAGE, "override '%s': expected KEY=VALUE", assignment);
    goto done;
  }

  /* VALUE as TOML if all of it parses as one value, else the text itself (blanks trimmed). */
  const char *text = kp.p, *text_end = kp.end;
  while (is_ws(*text)) text++;
  while (text_end > text && is_ws(text_end[-1])) text_end--;
  parser vp = parser_over(text, (size_t)(text_end - text), NULL);
  vp.synthetic = true;
  st = parse_value(&vp, &v);
  if (st == CT_ERR_NOMEM) goto done;
  if (st == CT_OK && vp.p != vp.end) {
    ct_toml_free(v);
    v = NULL;
  }
  if (!v) {
    char *s = dup_n(text, (size_t)(text_end - text));
    if (!s || !(v = node_new(CT_TOML_STRING, 0, 0, ORIGIN_VALUE))) {
      free(s);
      st = nomem();
      goto done;
    }
    v->u.s = s;
  }

  for (int i = 0; i + 1 < k.n; i++) {
    ct_toml_value *next = ct_toml_get(t, k.seg[i].s);
    if (!next) {
      next = node_new(CT_TOML_TABLE, 0, 0, ORIGIN_IMPLICIT);
      CT_TRY_GOTO(table_add(t, ct_strdup(k.seg[i].s), next), done);
    } else if (next->type != CT_TOML_TABLE) {
      st = ct_set_error(CT_ERR_USAGE, "override '%s': '%s' is a %s, not a table", assignment,
                        keypath_text(&k, i, name, sizeof name), ct_toml_type_name(next->type));
      goto done;
    }
    t = next;
  }
  keyseg *last = &k.seg[k.n - 1];
  ct_toml_entry *e = find_entry(t, last->s, strlen(last->s));
  if (e) {
    ct_toml_free(e->value);
    e->value = v;
    st = CT_OK;
  } else {
    st = table_add(t, last->s, v);
    last->s = NULL;
  }
  v = NULL; /* owned by the tree now */
done:
  ct_toml_free(v);
  keypath_free(&k);
  return st;
}

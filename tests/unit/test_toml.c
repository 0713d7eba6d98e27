/* tests/unit/test_toml.c — the TOML parser: every feature of a valid document checked by value,
 * command-line overrides, and one case per error class checked for its "file:LINE:COL:" prefix. */
#include <fcntl.h>
#include <stdint.h>
#include <unistd.h>

#include "common/toml.h"
#include "tests/unit/ct_test.h"

/* ---- lookups that return false on any mismatch of type or value ---- */

static const ct_toml_value *typed(const ct_toml_value *root, const char *path, ct_toml_type t) {
  const ct_toml_value *v = ct_toml_get_path(root, path);
  return v && v->type == t ? v : NULL;
}
static int is_str(const ct_toml_value *root, const char *path, const char *want) {
  const ct_toml_value *v = typed(root, path, CT_TOML_STRING);
  return v && strcmp(v->u.s, want) == 0;
}
static int is_int(const ct_toml_value *root, const char *path, int64_t want) {
  const ct_toml_value *v = typed(root, path, CT_TOML_INT);
  return v && v->u.i == want;
}
static int is_float(const ct_toml_value *root, const char *path, double want) {
  const ct_toml_value *v = typed(root, path, CT_TOML_FLOAT);
  return v && fabs(v->u.f - want) <= 1e-12 * fabs(want);
}
static int is_bool(const ct_toml_value *root, const char *path, int want) {
  const ct_toml_value *v = typed(root, path, CT_TOML_BOOL);
  return v && v->u.b == want;
}
static int is_datetime(const ct_toml_value *root, const char *path, const char *want) {
  const ct_toml_value *v = typed(root, path, CT_TOML_DATETIME);
  return v && strcmp(v->u.s, want) == 0;
}
/* Element i of an array; NULL if `a` is not an array or too short. */
static const ct_toml_value *elem(const ct_toml_value *a, int i) {
  return a && a->type == CT_TOML_ARRAY && i < a->u.array.n ? a->u.array.items[i] : NULL;
}
static int elem_int(const ct_toml_value *a, int i, int64_t want) {
  const ct_toml_value *v = elem(a, i);
  return v && v->type == CT_TOML_INT && v->u.i == want;
}
static int elem_str(const ct_toml_value *a, int i, const char *want) {
  const ct_toml_value *v = elem(a, i);
  return v && v->type == CT_TOML_STRING && strcmp(v->u.s, want) == 0;
}
static int n_items(const ct_toml_value *v) {
  if (!v) return -1;
  return v->type == CT_TOML_ARRAY ? v->u.array.n : v->type == CT_TOML_TABLE ? v->u.table.n : -1;
}

static ct_toml_value *parse_ok(const char *src) {
  ct_toml_value *doc = NULL;
  ct_status st = ct_toml_parse(src, strlen(src), "t.toml", &doc);
  CHECK_MSG(st == CT_OK && doc, "parse failed: %s", ct_last_error());
  return doc;
}

/* ---- a valid document using every feature ---- */

static const char *doc_all =
    "# a comment line\n"
    "title = \"TOML \\\"test\\\"\"   # trailing comment\n"
    "bare_key-1 = 1\n"
    "\"quoted key\" = 2\n"
    "'literal.key' = 3\n"
    "\"\" = \"empty key\"\n"
    "esc = \"b\\b t\\t n\\n f\\f r\\r q\\\" bs\\\\ u\\u00e9 U\\U0001F600 tab\there\"\n"
    "lit = 'C:\\path\\no\\escape \"q\"'\n"
    "ml = \"\"\"\n"
    "line1\n"
    "  line2 \\\n"
    "     \n"
    "    continued \\u0041\"\"\"\n"
    "mlquotes = \"\"\"a \"\"quoted\"\" b\"\"\"\"\"\n"
    "mllit = '''\n"
    "raw \\n 'text'\n"
    "'''\n"
    "mllit2 = '''x'''''\n"
    "mlq1 = \"\"\"\"\"\"\"\n"
    "int_pos = +99\n"
    "int_neg = -17\n"
    "zero = 0\n"
    "neg_zero = -0\n"
    "under = 1_000_000\n"
    "hex = 0xDEAD_beef\n"
    "hex0 = 0x00ff\n"
    "oct = 0o755\n"
    "bin = 0b1101_0010\n"
    "max = 9223372036854775807\n"
    "min = -9223372036854775808\n"
    "hexmax = 0x7FFFFFFFFFFFFFFF\n"
    "flt = 3.1415\n"
    "flt_neg = -0.01\n"
    "flt_exp = 5e+22\n"
    "flt_exp2 = 1E06\n"
    "flt_neg_exp = -2E-2\n"
    "flt_both = 6.626e-34\n"
    "flt_under = 224_617.445_991\n"
    "flt_zero_exp = 0e0\n"
    "inf1 = inf\n"
    "inf2 = +inf\n"
    "inf3 = -inf\n"
    "nan1 = nan\n"
    "nan2 = -nan\n"
    "t = true\n"
    "f = false\n"
    "odt = 1979-05-27T07:32:00Z\n"
    "odt2 = 1979-05-27 07:32:00.999-07:00\n"
    "ldt = 1979-05-27T07:32:00\n"
    "ld = 1979-05-27 # a local date, then a comment\n"
    "lt = 07:32:00.5\n"
    "leap = 2024-02-29\n"
    "arr = [ 1, 2, 3, ]\n"
    "nested = [ [1, 2], [\"a\", 'b'], [] ]\n"
    "mixed = [ 1, \"two\", 3.5, true, { x = 1 }, [ 2 ] ]\n"
    "multiline_arr = [\n"
    "  1,  # one\n"
    "  # a comment line inside\n"
    "\n"
    "  2\n"
    "]\n"
    "inline = { x = 1, y.z = \"deep\", \"q k\" = [1, 2], sub = { a = true } }\n"
    "empty_inline = {}\n"
    "dotted.a.b = 1\n"
    "dotted.a.c = 2\n"
    "dotted . d = \"x\"\n"
    "site.\"google.com\" = true\n"
    "\n"
    "[table]\n"
    "key = \"value\"\n"
    "\n"
    "[table.sub]  # comment after a header\n"
    "n = 1\n"
    "\n"
    "[ spaced . \"header\" ]\n"
    "ok = true\n"
    "\n"
    "[[fruit]]\n"
    "name = \"apple\"\n"
    "[fruit.physical]\n"
    "color = \"red\"\n"
    "[[fruit.variety]]\n"
    "name = \"red delicious\"\n"
    "[[fruit.variety]]\n"
    "name = \"granny smith\"\n"
    "\n"
    "[[fruit]]\n"
    "name = \"banana\"\n"
    "[[fruit.variety]]\n"
    "name = \"plantain\"\n"
    "\n"
    "[dotdef]\n"
    "apple.color = \"red\"\n"
    "[dotdef.apple.texture]  # a sub-table of a table made by dotted keys\n"
    "smooth = true\n"
    "\n"
    "[x.y.z]\n"
    "w = 1\n"
    "[x]  # defining a super-table afterwards is allowed\n"
    "v = 2\n"
    "[[empty_aot]]\n"
    "[[empty_aot]]\n";

static void test_valid_document(void) {
  ct_toml_value *d = parse_ok(doc_all);
  if (!d) return;
  CHECK(d->type == CT_TOML_TABLE);

  /* keys and strings */
  CHECK(is_str(d, "title", "TOML \"test\""));
  CHECK(is_int(d, "bare_key-1", 1));
  CHECK(is_int(d, "quoted key", 2));
  const ct_toml_value *lk = ct_toml_get(d, "literal.key"); /* a quoted key keeps its dot */
  CHECK(lk && lk->type == CT_TOML_INT && lk->u.i == 3);
  CHECK(ct_toml_get_path(d, "literal.key") == NULL);
  const ct_toml_value *ek = ct_toml_get(d, "");
  CHECK(ek && ek->type == CT_TOML_STRING && strcmp(ek->u.s, "empty key") == 0);
  CHECK(is_str(d, "esc", "b\b t\t n\n f\f r\r q\" bs\\ u\xC3\xA9 U\xF0\x9F\x98\x80 tab\there"));
  CHECK(is_str(d, "lit", "C:\\path\\no\\escape \"q\""));
  CHECK(is_str(d, "ml", "line1\n  line2 continued A"));
  CHECK(is_str(d, "mlquotes", "a \"\"quoted\"\" b\"\""));
  CHECK(is_str(d, "mllit", "raw \\n 'text'\n"));
  CHECK(is_str(d, "mllit2", "x''"));
  CHECK(is_str(d, "mlq1", "\""));

  /* integers */
  CHECK(is_int(d, "int_pos", 99));
  CHECK(is_int(d, "int_neg", -17));
  CHECK(is_int(d, "zero", 0));
  CHECK(is_int(d, "neg_zero", 0));
  CHECK(is_int(d, "under", 1000000));
  CHECK(is_int(d, "hex", 0xDEADBEEF));
  CHECK(is_int(d, "hex0", 255));
  CHECK(is_int(d, "oct", 0755));
  CHECK(is_int(d, "bin", 0xD2));
  CHECK(is_int(d, "max", INT64_MAX));
  CHECK(is_int(d, "min", INT64_MIN));
  CHECK(is_int(d, "hexmax", INT64_MAX));

  /* floats */
  CHECK(is_float(d, "flt", 3.1415));
  CHECK(is_float(d, "flt_neg", -0.01));
  CHECK(is_float(d, "flt_exp", 5e22));
  CHECK(is_float(d, "flt_exp2", 1e6));
  CHECK(is_float(d, "flt_neg_exp", -2e-2));
  CHECK(is_float(d, "flt_both", 6.626e-34));
  CHECK(is_float(d, "flt_under", 224617.445991));
  CHECK(is_float(d, "flt_zero_exp", 0.0));
  const ct_toml_value *v;
  v = typed(d, "inf1", CT_TOML_FLOAT);
  CHECK(v && isinf(v->u.f) && v->u.f > 0);
  v = typed(d, "inf2", CT_TOML_FLOAT);
  CHECK(v && isinf(v->u.f) && v->u.f > 0);
  v = typed(d, "inf3", CT_TOML_FLOAT);
  CHECK(v && isinf(v->u.f) && v->u.f < 0);
  v = typed(d, "nan1", CT_TOML_FLOAT);
  CHECK(v && isnan(v->u.f) && !signbit(v->u.f));
  v = typed(d, "nan2", CT_TOML_FLOAT);
  CHECK(v && isnan(v->u.f) && signbit(v->u.f));

  /* booleans and date-times (kept as written) */
  CHECK(is_bool(d, "t", 1));
  CHECK(is_bool(d, "f", 0));
  CHECK(is_datetime(d, "odt", "1979-05-27T07:32:00Z"));
  CHECK(is_datetime(d, "odt2", "1979-05-27 07:32:00.999-07:00"));
  CHECK(is_datetime(d, "ldt", "1979-05-27T07:32:00"));
  CHECK(is_datetime(d, "ld", "1979-05-27"));
  CHECK(is_datetime(d, "lt", "07:32:00.5"));
  CHECK(is_datetime(d, "leap", "2024-02-29"));

  /* arrays */
  const ct_toml_value *a = ct_toml_get(d, "arr");
  CHECK(n_items(a) == 3 && elem_int(a, 0, 1) && elem_int(a, 1, 2) && elem_int(a, 2, 3));
  a = ct_toml_get(d, "nested");
  CHECK(n_items(a) == 3);
  CHECK(n_items(elem(a, 0)) == 2 && elem_int(elem(a, 0), 0, 1) && elem_int(elem(a, 0), 1, 2));
  CHECK(n_items(elem(a, 1)) == 2 && elem_str(elem(a, 1), 0, "a") && elem_str(elem(a, 1), 1, "b"));
  CHECK(n_items(elem(a, 2)) == 0 && elem(a, 2) && elem(a, 2)->type == CT_TOML_ARRAY);
  a = ct_toml_get(d, "mixed");
  CHECK(n_items(a) == 6);
  CHECK(elem_int(a, 0, 1) && elem_str(a, 1, "two"));
  CHECK(elem(a, 2) && elem(a, 2)->type == CT_TOML_FLOAT && elem(a, 2)->u.f == 3.5);
  CHECK(elem(a, 3) && elem(a, 3)->type == CT_TOML_BOOL && elem(a, 3)->u.b);
  CHECK(is_int(elem(a, 4), "x", 1));
  CHECK(n_items(elem(a, 5)) == 1 && elem_int(elem(a, 5), 0, 2));
  a = ct_toml_get(d, "multiline_arr");
  CHECK(n_items(a) == 2 && elem_int(a, 0, 1) && elem_int(a, 1, 2));

  /* inline tables */
  CHECK(n_items(ct_toml_get(d, "inline")) == 4);
  CHECK(is_int(d, "inline.x", 1));
  CHECK(is_str(d, "inline.y.z", "deep"));
  const ct_toml_value *qk = ct_toml_get(ct_toml_get(d, "inline"), "q k");
  CHECK(n_items(qk) == 2 && elem_int(qk, 1, 2));
  CHECK(is_bool(d, "inline.sub.a", 1));
  v = ct_toml_get(d, "empty_inline");
  CHECK(v && v->type == CT_TOML_TABLE && v->u.table.n == 0);

  /* dotted keys make implicit tables */
  CHECK(typed(d, "dotted", CT_TOML_TABLE) && typed(d, "dotted.a", CT_TOML_TABLE));
  CHECK(is_int(d, "dotted.a.b", 1));
  CHECK(is_int(d, "dotted.a.c", 2));
  CHECK(is_str(d, "dotted.d", "x"));
  const ct_toml_value *g = ct_toml_get(ct_toml_get(d, "site"), "google.com");
  CHECK(g && g->type == CT_TOML_BOOL && g->u.b);

  /* tables */
  CHECK(is_str(d, "table.key", "value"));
  CHECK(is_int(d, "table.sub.n", 1));
  CHECK(is_bool(d, "spaced.header.ok", 1));
  CHECK(is_str(d, "dotdef.apple.color", "red"));
  CHECK(is_bool(d, "dotdef.apple.texture.smooth", 1));
  CHECK(is_int(d, "x.y.z.w", 1));
  CHECK(is_int(d, "x.v", 2));
  /* entries stay in definition order */
  const ct_toml_value *x = ct_toml_get(d, "x");
  CHECK(n_items(x) == 2 && strcmp(x->u.table.items[0].key, "y") == 0 &&
        strcmp(x->u.table.items[1].key, "v") == 0);

  /* array of tables, with sub-tables and nested arrays of tables going into the last element */
  const ct_toml_value *fruit = typed(d, "fruit", CT_TOML_ARRAY);
  CHECK(n_items(fruit) == 2);
  const ct_toml_value *apple = elem(fruit, 0), *banana = elem(fruit, 1);
  CHECK(is_str(apple, "name", "apple"));
  CHECK(is_str(apple, "physical.color", "red"));
  const ct_toml_value *var = ct_toml_get(apple, "variety");
  CHECK(n_items(var) == 2 && is_str(elem(var, 0), "name", "red delicious") &&
        is_str(elem(var, 1), "name", "granny smith"));
  CHECK(is_str(banana, "name", "banana"));
  CHECK(ct_toml_get(banana, "physical") == NULL);
  var = ct_toml_get(banana, "variety");
  CHECK(n_items(var) == 1 && is_str(elem(var, 0), "name", "plantain"));
  const ct_toml_value *ea = ct_toml_get(d, "empty_aot");
  CHECK(n_items(ea) == 2 && n_items(elem(ea, 0)) == 0 && n_items(elem(ea, 1)) == 0);

  /* positions: 1-based line and column of the value */
  v = ct_toml_get(d, "bare_key-1");
  CHECK(v && v->line == 3 && v->col == 14);
  v = ct_toml_get(d, "odt");
  CHECK(v && v->line == 47 && v->col == 7);

  /* lookups that miss */
  CHECK(ct_toml_get_path(d, "nope") == NULL);
  CHECK(ct_toml_get_path(d, "table.key.deeper") == NULL);
  CHECK(ct_toml_get(ct_toml_get(d, "title"), "x") == NULL);
  ct_toml_free(d);
}

static void test_small_documents(void) {
  /* CRLF line endings, in statements and inside multi-line strings */
  ct_toml_value *d =
      parse_ok("a = 1\r\nb = \"\"\"\r\nx\r\ny\"\"\"\r\n# c\r\n[t]\r\nc = [\r\n 1,\r\n]\r\n");
  if (d) {
    CHECK(is_int(d, "a", 1));
    CHECK(is_str(d, "b", "x\ny"));
    CHECK(n_items(ct_toml_get_path(d, "t.c")) == 1);
  }
  ct_toml_free(d);

  /* empty document, comment-only document, no final newline, byte-order mark */
  d = parse_ok("");
  CHECK(n_items(d) == 0);
  ct_toml_free(d);
  d = parse_ok("# nothing\n\n   \n");
  CHECK(n_items(d) == 0);
  ct_toml_free(d);
  d = parse_ok("\xEF\xBB\xBFk = 'v'");
  CHECK(is_str(d, "k", "v"));
  ct_toml_free(d);

  /* invalid UTF-8 is kept as bytes */
  d = parse_ok("s = \"\xFF\xFE\"\n");
  CHECK(is_str(d, "s", "\xFF\xFE"));
  ct_toml_free(d);

  CHECK(strcmp(ct_toml_type_name(CT_TOML_INT), "integer") == 0);
  CHECK(strcmp(ct_toml_type_name(CT_TOML_TABLE), "table") == 0);
  CHECK(strcmp(ct_toml_type_name(CT_TOML_DATETIME), "datetime") == 0);
}

static void test_files(void) {
  ct_toml_value *d = (ct_toml_value *)1;
  ct_status st = ct_toml_parse_file("/nonexistent/dir/cfg.toml", &d);
  CHECK(st == CT_ERR_INPUT && d == NULL);
  CHECK(strstr(ct_last_error(), "/nonexistent/dir/cfg.toml") != NULL);

  char path[] = "/tmp/test_toml_XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  if (fd < 0) return;
  const char *text = "[train]\nlr = 3e-4\nsteps = 10\n\n[model]\nbad = \n";
  CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
  close(fd);
  st = ct_toml_parse_file(path, &d);
  char want[64];
  snprintf(want, sizeof want, "%s:6:7: ", path);
  CHECK(st == CT_ERR_CONFIG && d == NULL);
  CHECK_MSG(strncmp(ct_last_error(), want, strlen(want)) == 0, "got '%s'", ct_last_error());

  fd = open(path, O_WRONLY | O_TRUNC);
  CHECK(fd >= 0 && write(fd, text, 20) == 20); /* "[train]\nlr = 3e-4\nst": cut inside a key */
  close(fd);
  st = ct_toml_parse_file(path, &d);
  CHECK(st == CT_ERR_CONFIG);
  fd = open(path, O_WRONLY | O_TRUNC);
  CHECK(fd >= 0 && write(fd, text, 18) == 18);
  close(fd);
  st = ct_toml_parse_file(path, &d);
  CHECK(st == CT_OK && is_float(d, "train.lr", 3e-4));
  ct_toml_free(d);
  unlink(path);
}

/* ---- overrides ---- */

static void test_overrides(void) {
  ct_toml_value *d = parse_ok("[train]\nlr = 0.1\nsteps = 10\nname = \"x\"\nlist = [1]\n");
  if (!d) return;
  CHECK(ct_toml_set_override(d, "train.lr=3e-4") == CT_OK);
  CHECK(is_float(d, "train.lr", 3e-4));
  CHECK(ct_toml_set_override(d, "train.steps=200") == CT_OK);
  CHECK(is_int(d, "train.steps", 200));
  CHECK(ct_toml_set_override(d, "train.steps=0x10") == CT_OK);
  CHECK(is_int(d, "train.steps", 16));
  CHECK(ct_toml_set_override(d, "train.schedule=cosine") == CT_OK);
  CHECK(is_str(d, "train.schedule", "cosine"));
  CHECK(ct_toml_set_override(d, "train.flag=true") == CT_OK);
  CHECK(is_bool(d, "train.flag", 1));
  CHECK(ct_toml_set_override(d, "train.name=\"quoted # not a comment\"") == CT_OK);
  CHECK(is_str(d, "train.name", "quoted # not a comment"));
  CHECK(ct_toml_set_override(d, "train.list=[1, 2, \"three\"]") == CT_OK);
  const ct_toml_value *l = ct_toml_get_path(d, "train.list");
  CHECK(n_items(l) == 3 && elem_int(l, 0, 1) && elem_int(l, 1, 2) && elem_str(l, 2, "three"));
  /* replaced, not duplicated; position of an override value is 0,0 */
  const ct_toml_value *train = ct_toml_get(d, "train");
  CHECK(n_items(train) == 6);
  CHECK(l && l->line == 0 && l->col == 0);

  /* text that is not one TOML value becomes a string */
  CHECK(ct_toml_set_override(d, "train.path=/data/x.bin") == CT_OK);
  CHECK(is_str(d, "train.path", "/data/x.bin"));
  CHECK(ct_toml_set_override(d, "train.desc=1.0 epochs") == CT_OK);
  CHECK(is_str(d, "train.desc", "1.0 epochs"));
  CHECK(ct_toml_set_override(d, "train.open=[1,") == CT_OK);
  CHECK(is_str(d, "train.open", "[1,"));
  CHECK(ct_toml_set_override(d, "train.empty=") == CT_OK);
  CHECK(is_str(d, "train.empty", ""));
  CHECK(ct_toml_set_override(d, "train.spaced = 5 ") == CT_OK);
  CHECK(is_int(d, "train.spaced", 5));

  /* new tables on the way, quoted key segments */
  CHECK(ct_toml_set_override(d, "model.layers.n=12") == CT_OK);
  CHECK(typed(d, "model", CT_TOML_TABLE) && is_int(d, "model.layers.n", 12));
  CHECK(ct_toml_set_override(d, "model.'a.b'=inf") == CT_OK);
  const ct_toml_value *ab = ct_toml_get(ct_toml_get(d, "model"), "a.b");
  CHECK(ab && ab->type == CT_TOML_FLOAT && isinf(ab->u.f));
  CHECK(ct_toml_set_override(d, "model.inline={ a = 1, b.c = \"x\" }") == CT_OK);
  CHECK(is_int(d, "model.inline.a", 1) && is_str(d, "model.inline.b.c", "x"));
  CHECK(ct_toml_set_override(d, "date=2024-01-02") == CT_OK);
  CHECK(is_datetime(d, "date", "2024-01-02"));

  /* errors: usage, naming the override */
  ct_status st = ct_toml_set_override(d, "train.lr");
  CHECK(st == CT_ERR_USAGE && strstr(ct_last_error(), "'train.lr'"));
  st = ct_toml_set_override(d, "train.lr.x=1");
  CHECK(st == CT_ERR_USAGE && strstr(ct_last_error(), "'train.lr.x=1'") &&
        strstr(ct_last_error(), "'train.lr' is a float"));
  st = ct_toml_set_override(d, "=1");
  CHECK(st == CT_ERR_USAGE && strstr(ct_last_error(), "'=1'"));
  st = ct_toml_set_override(d, "a..b=1");
  CHECK(st == CT_ERR_USAGE && strstr(ct_last_error(), "'a..b=1'") &&
        strstr(ct_last_error(), "column 3"));
  CHECK(is_float(d, "train.lr", 3e-4)); /* failed overrides changed nothing */
  CHECK(ct_toml_get(d, "a") == NULL);

  /* replacing a whole table by a scalar is a replacement like any other */
  CHECK(ct_toml_set_override(d, "model=7") == CT_OK);
  CHECK(is_int(d, "model", 7));
  ct_toml_free(d);
}

/* ---- errors: one per class, with the exact position ---- */

static void expect_error(const char *src, const char *prefix, const char *fragment) {
  ct_toml_value *d = (ct_toml_value *)1;
  ct_status st = ct_toml_parse(src, strlen(src), "t.toml", &d);
  const char *msg = ct_last_error();
  CHECK_MSG(st == CT_ERR_CONFIG && d == NULL, "source [%s]: status %d", src, (int)st);
  CHECK_MSG(strncmp(msg, prefix, strlen(prefix)) == 0 && strstr(msg, fragment),
            "source [%s]: want '%s...%s', got '%s'", src, prefix, fragment, msg);
  if (st == CT_OK) ct_toml_free(d);
}

static void test_errors(void) {
  /* duplicates and redefinitions */
  expect_error("a = 1\na = 2\n", "t.toml:2:1: ", "duplicate key 'a'");
  expect_error("a.b = 1\na.b = 2\n", "t.toml:2:3: ", "duplicate key 'a.b'");
  expect_error("[t]\nx = 1\nx = {}\n", "t.toml:3:1: ", "first defined at 2:5");
  expect_error("[a]\nx = 1\n[a]\n", "t.toml:3:2: ", "table [a] is already defined");
  expect_error("[a]\nb.c = 1\n[a.b]\n", "t.toml:3:4: ", "by dotted keys");
  expect_error("a = 1\n[a]\n", "t.toml:2:2: ", "already defined");
  expect_error("[[a]]\n[a]\n", "t.toml:2:2: ", "array of tables");
  expect_error("a = [1]\n[[a]]\n", "t.toml:2:3: ", "as an array value");
  expect_error("[a]\n[[a]]\n", "t.toml:2:3: ", "cannot make [[a]]");
  expect_error("a = 1\nb.x = 2\nb = 3\n", "t.toml:3:1: ", "duplicate key 'b'");

  /* extending inline tables, values and header tables */
  expect_error("a = {x = 1}\na.y = 2\n", "t.toml:2:1: ", "as an inline table");
  expect_error("a = {x = 1}\n[a.b]\n", "t.toml:2:2: ", "as an inline table");
  expect_error("a = {x = 1}\n[a]\n", "t.toml:2:2: ", "as an inline table");
  expect_error("a = {b = {x = 1}, b.y = 2}\n", "t.toml:1:19: ", "as an inline table");
  expect_error("a = 1\na.b = 2\n", "t.toml:2:1: ", "as a value of type integer");
  expect_error("a = 'x'\n[a.b]\n", "t.toml:2:2: ", "cannot add a table under 'a'");
  expect_error("a = [{x = 1}]\n[a.b]\n", "t.toml:2:2: ", "as an array value");
  expect_error("[a.b]\nx = 1\n[a]\nb.y = 2\n", "t.toml:4:1: ", "by a [table] header");
  expect_error("[a.b.c]\n[a]\nb.d = 1\n", "t.toml:3:1: ", "cannot add keys to 'b'");

  /* strings */
  expect_error("a = \"abc\nb = 1\n", "t.toml:1:5: ", "unterminated string");
  expect_error("a = 'abc", "t.toml:1:5: ", "unterminated string");
  expect_error("a = 1\nb = \"\"\"abc\n\n", "t.toml:2:5: ", "unterminated string");
  expect_error("x = '''abc''", "t.toml:1:5: ", "unterminated string");
  expect_error("a = \"x\\qy\"\n", "t.toml:1:7: ", "invalid escape '\\q'");
  expect_error("a = \"\\e\"\n", "t.toml:1:6: ", "invalid escape");
  expect_error("a = \"x\\ y\"\n", "t.toml:1:7: ", "invalid escape '\\ '");
  expect_error("a = \"\\uD800\"\n", "t.toml:1:6: ", "not a Unicode scalar value");
  expect_error("a = \"\\U00110000\"\n", "t.toml:1:6: ", "not a Unicode scalar value");
  expect_error("a = \"\\u12\"\n", "t.toml:1:6: ", "4 hex digits");
  expect_error("a = \"\\u0000\"\n", "t.toml:1:6: ", "U+0000");
  expect_error("a = \"\"\"\nline\n  \\q\"\"\"\n", "t.toml:3:3: ", "invalid escape");
  expect_error("a = \"x\x01y\"\n", "t.toml:1:7: ", "control character 0x01");
  expect_error("a = 'x\x7fy'\n", "t.toml:1:7: ", "control character 0x7f");
  expect_error("a = \"\"\"x\ry\"\"\"\n", "t.toml:1:9: ", "control character 0x0d");
  expect_error("# bad \x02 comment\n", "t.toml:1:7: ", "in a comment");

  /* numbers */
  expect_error("a = 1__2\n", "t.toml:1:6: ", "'_' must sit between two digits");
  expect_error("a = 1_\n", "t.toml:1:6: ", "'_'");
  expect_error("a = 0x_1\n", "t.toml:1:7: ", "expected a hex digit after '0x', found '_'");
  expect_error("a = 012\n", "t.toml:1:5: ", "leading zeros");
  expect_error("a = 00\n", "t.toml:1:5: ", "leading zeros");
  expect_error("a = -012.5\n", "t.toml:1:5: ", "leading zeros");
  expect_error("a = 9223372036854775808\n", "t.toml:1:5: ", "64 bits");
  expect_error("a = -9223372036854775809\n", "t.toml:1:5: ", "64 bits");
  expect_error("a = 0x8000000000000000\n", "t.toml:1:5: ", "64 bits");
  expect_error("a = +0x10\n", "t.toml:1:5: ", "take no sign");
  expect_error("a = 1.\n", "t.toml:1:7: ", "expected a digit after '.', found end of line");
  expect_error("a = 1.e5\n", "t.toml:1:7: ", "expected a digit after '.'");
  expect_error("a = 1e\n", "t.toml:1:7: ", "exponent");
  expect_error("a = 1e400\n", "t.toml:1:5: ", "out of range");
  expect_error("a = +\n", "t.toml:1:6: ", "expected a digit");
  expect_error("a = .5\n", "t.toml:1:5: ", "expected a value");
  expect_error("a = 0b102\n", "t.toml:1:9: ", "expected end of line after the value, found '2'");
  expect_error("a = infinity\n", "t.toml:1:8: ", "found 'i'");
  expect_error("d = 2023-02-29\n", "t.toml:1:5: ", "invalid date");
  expect_error("d = 2023-13-01\n", "t.toml:1:5: ", "invalid date");
  expect_error("d = 12:61:00\n", "t.toml:1:5: ", "invalid time");
  expect_error("d = 1979-05-27T07:32\n", "t.toml:1:21: ", "HH:MM:SS");

  /* structure */
  expect_error("a 1\n", "t.toml:1:3: ", "expected '=' after the key 'a', found '1'");
  expect_error("key\n", "t.toml:1:4: ", "found end of line");
  expect_error("a =\n", "t.toml:1:4: ", "expected a value");
  expect_error("a = 1 2\n", "t.toml:1:7: ", "expected end of line after the value, found '2'");
  expect_error("a = \"x\" y\n", "t.toml:1:9: ", "end of line");
  expect_error("a = true1\n", "t.toml:1:9: ", "end of line");
  expect_error("[a] b = 1\n", "t.toml:1:5: ", "after the table header");
  expect_error("a = 1\rb = 2\n", "t.toml:1:6: ", "byte 0x0d");
  expect_error("a = [1, 2\nb = 3\n", "t.toml:2:1: ", "',' or ']' in the array opened at 1:5");
  expect_error("a = [1,", "t.toml:1:8: ", "found end of input");
  expect_error("a = [1,,2]\n", "t.toml:1:8: ", "expected a value");
  expect_error("a..b = 1\n", "t.toml:1:3: ", "expected a key");
  expect_error("= 1\n", "t.toml:1:1: ", "expected a key");
  expect_error("a.=1\n", "t.toml:1:3: ", "expected a key");
  expect_error("k\xC3\xA9 = 1\n", "t.toml:1:2: ", "byte 0xc3");
  expect_error("\"\"\"k\"\"\" = 1\n", "t.toml:1:1: ", "multi-line string cannot be a key");
  expect_error("[a.]\n", "t.toml:1:4: ", "expected a key");
  expect_error("[a\nb = 1\n", "t.toml:1:3: ", "']' to close the table header");
  expect_error("[[a]\n", "t.toml:1:5: ", "']]'");
  expect_error("[]\n", "t.toml:1:2: ", "expected a key");
  expect_error("a = {x = 1,\ny = 2}\n", "t.toml:1:12: ", "expected a key");
  expect_error("a = {x = 1\n}\n", "t.toml:1:11: ", "it must fit on one line");
  expect_error("a = {x = 1,}\n", "t.toml:1:12: ", "trailing comma");
  expect_error("a = {x = 1 y = 2}\n", "t.toml:1:12: ", "',' or '}'");
  expect_error("x = 1\r\ny = @\r\n", "t.toml:2:5: ", "expected a value");

  /* nesting is bounded instead of overflowing the stack */
  char deep[600];
  memset(deep, '[', sizeof deep - 1);
  deep[0] = 'a', deep[1] = '=';
  deep[sizeof deep - 1] = '\0';
  expect_error(deep, "t.toml:1:131: ", "nested more than 128 deep");

  /* no file name: a placeholder keeps the prefix shape */
  ct_toml_value *d = NULL;
  CHECK(ct_toml_parse("a = ?", 5, NULL, &d) == CT_ERR_CONFIG && d == NULL);
  CHECK(strncmp(ct_last_error(), "<toml>:1:5: ", 12) == 0);
}

int main(void) {
  test_valid_document();
  test_small_documents();
  test_files();
  test_overrides();
  test_errors();
  return ct_test_finish();
}

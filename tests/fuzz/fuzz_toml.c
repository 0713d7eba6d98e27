/* tests/fuzz/fuzz_toml.c — libFuzzer harness for the TOML parser (common/toml.c).
 *
 * The input is parsed as a whole document. A successful parse must give a TABLE whose tree is
 * well formed (checked by walking it: types, counts, NUL-terminated strings, keys that look
 * themselves up) and must free cleanly (LeakSanitizer checks inputs that leave allocations
 * behind). The first line of the input is also applied as a command-line override
 * ("a.b=VALUE") to the parsed document, or to a fresh one when the parse failed, and the result
 * is walked again. Failures must be CT_ERR_CONFIG (document) or CT_ERR_USAGE (override), never
 * CT_ERR_NOMEM. Built by tests/fuzz/run.sh.
 */
#define _GNU_SOURCE /* memfd_create, in tests/fuzz/fuzz.h */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/toml.h"
#include "tests/fuzz/fuzz.h"

/* Walks the tree; returns the node count so the compiler cannot drop the walk. */
static size_t walk(const ct_toml_value *v, int depth) {
  CHECK(v && depth < 10000);
  size_t n = 1;
  switch (v->type) {
    case CT_TOML_TABLE:
      CHECK(v->u.table.n >= 0 && v->u.table.n <= v->u.table.cap);
      for (int i = 0; i < v->u.table.n; i++) {
        const ct_toml_entry *e = &v->u.table.items[i];
        CHECK(e->key && e->value);
        (void)strlen(e->key);
        /* the first entry with this key is this one: no duplicates survive a parse */
        CHECK(ct_toml_get(v, e->key) == e->value);
        n += walk(e->value, depth + 1);
      }
      break;
    case CT_TOML_ARRAY:
      CHECK(v->u.array.n >= 0 && v->u.array.n <= v->u.array.cap);
      for (int i = 0; i < v->u.array.n; i++) n += walk(v->u.array.items[i], depth + 1);
      break;
    case CT_TOML_STRING:
    case CT_TOML_DATETIME:
      CHECK(v->u.s);
      n += strlen(v->u.s);
      break;
    case CT_TOML_INT:
    case CT_TOML_FLOAT:
    case CT_TOML_BOOL:
      break;
    default:
      CHECK(0);
  }
  return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ct_toml_value *root = NULL;
  ct_status st = ct_toml_parse((const char *)data, size, "fuzz.toml", &root);
  if (st == CT_OK) {
    CHECK(root && root->type == CT_TOML_TABLE);
    walk(root, 0);
    ct_toml_get_path(root, "model.arch");
    ct_toml_get_path(root, "a.b.c");
  } else {
    CHECK(root == NULL);
    CHECK(st == CT_ERR_CONFIG); /* syntax errors are config errors, never "out of memory" */
    CHECK(ct_toml_parse("", 0, "empty.toml", &root) == CT_OK);
  }

  /* the first line (NUL-terminated, at most 255 bytes) as an override */
  char line[256];
  size_t k = 0;
  while (k < size && k < sizeof line - 1 && data[k] != '\n') line[k] = (char)data[k], k++;
  line[k] = '\0';
  st = ct_toml_set_override(root, line);
  CHECK(st == CT_OK || st == CT_ERR_USAGE);
  walk(root, 0);
  if (st == CT_OK && strchr(line, '=')) {
    /* the key before '=' (when it is a plain dotted key) now resolves */
    char key[256];
    size_t kl = (size_t)(strchr(line, '=') - line);
    memcpy(key, line, kl);
    key[kl] = '\0';
    bool plain = kl > 0;
    for (size_t i = 0; i < kl; i++)
      if (!((key[i] >= 'a' && key[i] <= 'z') || (key[i] >= '0' && key[i] <= '9') || key[i] == '.' ||
            key[i] == '_'))
        plain = false;
    if (plain && key[0] != '.' && key[kl - 1] != '.' && !strstr(key, ".."))
      CHECK(ct_toml_get_path(root, key) != NULL);
  }
  ct_toml_free(root);
  return 0;
}

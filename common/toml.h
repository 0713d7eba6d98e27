/* common/toml.h — a TOML 1.0 parser (no C TOML library is packaged in Debian 12).
 *
 * Parses a document into a tree of ct_toml_value nodes owned by the root. Supported: tables,
 * array of tables, dotted keys, bare/quoted keys, basic and literal strings (single- and
 * multi-line, all escapes incl. \uXXXX and \UXXXXXXXX), integers (sign, `_`, 0x/0o/0b),
 * floats (exponent, `_`, inf, nan), booleans, offset/local date-times, dates and times (kept as
 * their text, type CT_TOML_DATETIME), arrays (mixed types, trailing comma, newlines and comments
 * inside), inline tables, comments. Redefinition of a key or table is an error.
 *
 * Errors: CT_ERR_CONFIG with a message "FILE:LINE:COL: what was expected", LINE and COL
 * 1-based, COL counting bytes from the start of the line.
 */
#ifndef CT_TOML_H
#define CT_TOML_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef enum ct_toml_type {
  CT_TOML_TABLE,
  CT_TOML_ARRAY,
  CT_TOML_STRING,
  CT_TOML_INT,
  CT_TOML_FLOAT,
  CT_TOML_BOOL,
  CT_TOML_DATETIME,
} ct_toml_type;

typedef struct ct_toml_value ct_toml_value;

typedef struct ct_toml_entry {
  char *key;            /* one key segment, unescaped (owned) */
  ct_toml_value *value; /* owned */
  int line, col;        /* where the key appeared (for "unknown key" messages) */
} ct_toml_entry;

struct ct_toml_value {
  ct_toml_type type;
  int line, col;        /* where the value (or table header) appeared; 0,0 for synthesized */
  union {
    char *s;            /* STRING, DATETIME: NUL-terminated UTF-8 (owned) */
    int64_t i;          /* INT */
    double f;           /* FLOAT */
    bool b;             /* BOOL */
    struct { ct_toml_entry *items; int n, cap; } table;   /* TABLE, in definition order */
    struct { ct_toml_value **items; int n, cap; } array;  /* ARRAY */
  } u;
};

/* Parses `len` bytes of `src`; `filename` is used only in messages. *root receives a TABLE. */
ct_status ct_toml_parse(const char *src, size_t len, const char *filename, ct_toml_value **root);

/* Reads and parses a file. A missing file is CT_ERR_INPUT naming the path. */
ct_status ct_toml_parse_file(const char *path, ct_toml_value **root);

void ct_toml_free(ct_toml_value *v);

/* Lookup of one key segment in a table; NULL if absent or `table` is not a TABLE. */
ct_toml_value *ct_toml_get(const ct_toml_value *table, const char *key);

/* Lookup of a dotted path ("train.lr"); segments are split at '.'. NULL if absent. */
ct_toml_value *ct_toml_get_path(const ct_toml_value *root, const char *path);

/* Command-line override "a.b.c=VALUE": VALUE is parsed as a TOML value (so `3e-4`, `true`,
 * `"x"`, `[1,2]` work); if it does not parse as one, it is taken as a plain string
 * (`train.schedule=cosine`). Intermediate tables are created; an existing value is replaced.
 * Errors name the override text. */
ct_status ct_toml_set_override(ct_toml_value *root, const char *assignment);

const char *ct_toml_type_name(ct_toml_type t);

#endif

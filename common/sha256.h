/* common/sha256.h — SHA-256 (FIPS 180-4), for content digests such as a tokenizer's identity.
 *
 *     ct_sha256_ctx c; ct_sha256_init(&c);
 *     ct_sha256_update(&c, buf, n);   // any number of times
 *     uint8_t d[32]; ct_sha256_final(&c, d);
 * or ct_sha256(buf, n, d) in one call; ct_sha256_hex writes the 64 lowercase hex digits + NUL.
 * Plain portable C, ~200-300 MB/s: digests of config-sized files, not a bulk hash.
 */
#ifndef CT_SHA256_H
#define CT_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct ct_sha256_ctx {
  uint32_t h[8];
  uint64_t n_bytes;  /* total length so far */
  uint8_t block[64]; /* pending partial block */
  size_t n_block;
} ct_sha256_ctx;

void ct_sha256_init(ct_sha256_ctx *c);
void ct_sha256_update(ct_sha256_ctx *c, const void *data, size_t n);
void ct_sha256_final(ct_sha256_ctx *c, uint8_t digest[32]);
void ct_sha256(const void *data, size_t n, uint8_t digest[32]);
/* hex (capacity >= 65) gets the digest as 64 lowercase hex digits, NUL-terminated. */
void ct_sha256_hex(const void *data, size_t n, char hex[65]);

#endif

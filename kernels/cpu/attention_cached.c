/* kernels/cpu/attention_cached.c — attention over a KV cache (inference; see ops.h).
 * q rows come from qkv (row stride (H+2KV)*hd, q section first); kc, vc (KV, max_T, hd).
 * Query i (position pos0+i) attends to keys 0 .. pos0+i; softmax in fp32 with max subtraction.
 * Parallel over (query, head); O(n * (pos0+n) * hd) per head. */
#include <math.h>
#include <stdlib.h>

#include "kernels/ops.h"

void ct_cpu_attention_cached(void *out_, const void *qkv_, const void *kc_, const void *vc_, int n,
                             int pos0, int H, int KV, int hd, int max_T) {
  float *out = out_;
  const float *qkv = qkv_, *kc = kc_, *vc = vc_;
  const int W = (H + 2 * KV) * hd, group = H / KV;
  const float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel
  {
    float *p = malloc(sizeof(float) * (size_t)(pos0 + n));
#pragma omp for collapse(2) schedule(static)
    for (int i = 0; i < n; i++) {
      for (int h = 0; h < H; h++) {
        const float *q = qkv + (size_t)i * W + (size_t)h * hd;
        const float *k = kc + (size_t)(h / group) * max_T * hd;
        const float *v = vc + (size_t)(h / group) * max_T * hd;
        const int len = pos0 + i + 1;
        float mx = -INFINITY;
        for (int j = 0; j < len; j++) {
          float s = 0;
          for (int d = 0; d < hd; d++) s += q[d] * k[(size_t)j * hd + d];
          p[j] = s * scale;
          if (p[j] > mx) mx = p[j];
        }
        double sum = 0;
        for (int j = 0; j < len; j++) {
          p[j] = expf(p[j] - mx);
          sum += p[j];
        }
        const float inv = (float)(1.0 / sum);
        float *o = out + (size_t)i * H * hd + (size_t)h * hd;
        for (int d = 0; d < hd; d++) o[d] = 0;
        for (int j = 0; j < len; j++) {
          const float w = p[j] * inv;
          for (int d = 0; d < hd; d++) o[d] += w * v[(size_t)j * hd + d];
        }
      }
    }
    free(p);
  }
}

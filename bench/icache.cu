// bench/icache.cu — how much a multiprocessor's instruction caches hold, and what a kernel pays
// when its code is not in them. The decode step runs five kernels a layer (~150 KB of distinct
// SASS, kernels/cuda/decode.cu's notes), and attention's split math took 1.77 us run once and
// 0.69 run a second time from the same code (calls 169-170): if the code a layer runs is larger
// than what a multiprocessor keeps, every kernel starts cold every layer.
//
// A probe kernel (16 KB of straight-line FFMAs: 8 independent chains, so issue-bound when its
// code is cached) times its own body with clock64 on every multiprocessor (one block each, one
// warp a scheduler). Between two runs of the probe, k other kernels of 16 KB each run; when the
// probe's time jumps, k * 16 KB (+ the probe's 16) has passed what the caches hold. A 4 KB probe
// gives the cost a KB of cold code.
//
// Build and run (any sm_90 card):
//     built as bench/icache in CUDA builds (meson), or by hand:
//     nvcc -O3 -arch=sm_90 -o icache bench/icache.cu && ./icache
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                     \
  do {                                                                            \
    cudaError_t e_ = (x);                                                         \
    if (e_ != cudaSuccess) {                                                      \
      fprintf(stderr, "icache: %s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); \
      exit(1);                                                                    \
    }                                                                             \
  } while (0)

// N groups of 8 independent FFMAs (16 bytes of SASS each: 128 B a group). ID only makes each
// instantiation a kernel of its own, at its own address.
template <int ID, int N>
__global__ void __launch_bounds__(128) code_kernel(long long *cyc, float *sink, float a, float b) {
  float x0 = threadIdx.x, x1 = x0 + 1, x2 = x0 + 2, x3 = x0 + 3, x4 = x0 + 4, x5 = x0 + 5,
        x6 = x0 + 6, x7 = x0 + 7 + ID;
  __syncwarp();
  const long long t0 = clock64();
#pragma unroll
  for (int i = 0; i < N; i++)
    asm volatile(
        "fma.rn.f32 %0, %0, %8, %9;\n\tfma.rn.f32 %1, %1, %8, %9;\n\t"
        "fma.rn.f32 %2, %2, %8, %9;\n\tfma.rn.f32 %3, %3, %8, %9;\n\t"
        "fma.rn.f32 %4, %4, %8, %9;\n\tfma.rn.f32 %5, %5, %8, %9;\n\t"
        "fma.rn.f32 %6, %6, %8, %9;\n\tfma.rn.f32 %7, %7, %8, %9;"
        : "+f"(x0), "+f"(x1), "+f"(x2), "+f"(x3), "+f"(x4), "+f"(x5), "+f"(x6), "+f"(x7)
        : "f"(a), "f"(b));
  __syncwarp();
  const long long t1 = clock64();
  if (threadIdx.x == 0 && cyc) cyc[blockIdx.x] = t1 - t0;
  const float s = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7;
  if (s == 12345.678f) sink[threadIdx.x] = s; // never true; keeps the sums live
}

typedef void (*kfn)(long long *, float *, float, float);
#define E16(i) code_kernel<100 + i, 128>
static const kfn evict[] = {E16(0),  E16(1),  E16(2),  E16(3),  E16(4),  E16(5),  E16(6),
                            E16(7),  E16(8),  E16(9),  E16(10), E16(11), E16(12), E16(13),
                            E16(14), E16(15), E16(16), E16(17), E16(18), E16(19), E16(20),
                            E16(21), E16(22), E16(23)};
#define NEVICT (int)(sizeof(evict) / sizeof(evict[0]))

// The probe's mean cycles over every block and the last `reps - 2` of `reps` rounds, each round
// the probe and then the first k eviction kernels.
static double probe(kfn p, int k, int sms, long long *cyc, float *sink) {
  const int reps = 12;
  long long *h = (long long *)malloc(sizeof(long long) * sms);
  double sum = 0;
  int n = 0;
  for (int r = 0; r < reps; r++) {
    p<<<sms, 128>>>(cyc, sink, 1.0001f, 0.5f);
    for (int e = 0; e < k; e++) evict[e]<<<sms, 128>>>(NULL, sink, 1.0001f, 0.5f);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h, cyc, sizeof(long long) * sms, cudaMemcpyDeviceToHost));
    if (r < 2) continue;
    for (int b = 0; b < sms; b++) sum += (double)h[b];
    n += sms;
  }
  free(h);
  return sum / n;
}

int main(void) {
  cudaDeviceProp pr;
  CK(cudaGetDeviceProperties(&pr, 0));
  const int sms = pr.multiProcessorCount;
  long long *cyc;
  float *sink;
  CK(cudaMalloc(&cyc, sizeof(long long) * sms));
  CK(cudaMalloc(&sink, sizeof(float) * 128));
  printf("%s, %d multiprocessors; probe: straight-line FFMAs, 4 warps a multiprocessor, cycles of"
         " its body (mean over blocks and rounds)\n", pr.name, sms);
  printf("%-28s %12s %12s\n", "between two probe runs", "16 KB probe", "4 KB probe");
  const int ks[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24};
  for (unsigned i = 0; i < sizeof(ks) / sizeof(ks[0]); i++) {
    const int k = ks[i];
    if (k > NEVICT) break;
    const double c16 = probe(code_kernel<1, 128>, k, sms, cyc, sink);
    const double c4 = probe(code_kernel<2, 32>, k, sms, cyc, sink);
    char lab[64];
    snprintf(lab, sizeof lab, "%d kernels (%d KB)", k, 16 * k);
    printf("%-28s %12.0f %12.0f\n", lab, c16, c4);
  }
  CK(cudaFree(cyc));
  CK(cudaFree(sink));
  return 0;
}

// bench/graph_gap.cu — what a decode step's boundary costs on the GPU, without the model: the
// time from one kernel's last block ending to the next kernel's first block starting (%globaltimer
// on the device), for the ways a decode loop can chain its steps:
//   graph        a one-kernel CUDA graph replayed back to back
//   graph+copy   the same with each replay's 4-byte id copied to pinned host memory and an event
//                recorded after it (what trainer/model.c's decoding ahead queues between steps)
//   graph+event  an event recorded after each replay, no copy (the id written by the kernel
//                itself into mapped host memory)
//   two-kernel   a graph of two kernels, the second launched early (programmatic dependent
//                launch): the boundary inside a graph, as between two kernels of one step
//   one-ahead    graph+copy with the host one step ahead, waiting for each step's event before
//                queueing the one after the next (the decode loop's own pattern)
// Each kernel spins SPIN_US microseconds (default 20) so that the host stays ahead of the GPU.
// Built as bench/graph_gap in CUDA builds; run: graph_gap [SPIN_US] [N]. Call 153's numbers
// (H100): bench/results/call153-158_2026-12-06_H100_zerocopy/call153_graph_gap.txt.
#include <cuda_runtime.h>
#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      fprintf(stderr, "graph_gap: %s failed at line %d: %s\n", #x, __LINE__,                  \
              cudaGetErrorString(e_));                                                          \
      exit(1);                                                                                  \
    }                                                                                           \
  } while (0)

__device__ unsigned long long t_start[1 << 16], t_end[1 << 16];
__device__ unsigned n_launch;

__device__ __forceinline__ unsigned long long now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Every block spins spin_ns; block 0 notes its start and end under a launch index (every block
// spins as long, so block 0's end stands for the kernel's). With host != NULL block 0 also writes
// the index to mapped host memory (the zero-copy id). pdl: trigger the dependents at once and
// wait for the kernel before.
__global__ void step_kernel(unsigned long long spin_ns, volatile int *host, int pdl) {
  __shared__ unsigned idx;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 // programmatic dependent launch: sm_90 on
  if (pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  if (threadIdx.x == 0) {
    if (blockIdx.x == 0) {
      idx = atomicAdd(&n_launch, 1u);
      t_start[idx & 0xffff] = now();
    }
  }
  const unsigned long long t1 = now();
  while (now() - t1 < spin_ns) {
  }
  __syncthreads();
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    if (host) *host = (int)idx;
    t_end[idx & 0xffff] = now();
  }
}

struct gaps {
  double med, mean, p10, p90;
};

// The gaps (ns) from launch i's end to launch i + 1's start, from <= i < to - 1, i % step == phase.
static std::vector<double> gaps_of(unsigned from, unsigned to, unsigned step, unsigned phase) {
  std::vector<unsigned long long> s(1 << 16), e(1 << 16);
  CK(cudaMemcpyFromSymbol(s.data(), t_start, sizeof(unsigned long long) << 16));
  CK(cudaMemcpyFromSymbol(e.data(), t_end, sizeof(unsigned long long) << 16));
  std::vector<double> g;
  for (unsigned i = from; i + 1 < to; i++)
    if (i % step == phase) g.push_back((double)s[(i + 1) & 0xffff] - (double)e[i & 0xffff]);
  return g;
}

static gaps stats(std::vector<double> g) { // in us
  gaps r{};
  if (g.empty()) return r;
  std::sort(g.begin(), g.end());
  double sum = 0;
  for (double v : g) sum += v;
  r.med = g[g.size() / 2] / 1e3;
  r.mean = sum / g.size() / 1e3;
  r.p10 = g[g.size() / 10] / 1e3;
  r.p90 = g[g.size() * 9 / 10] / 1e3;
  return r;
}

static void reset() {
  unsigned z = 0;
  CK(cudaMemcpyToSymbol(n_launch, &z, sizeof z));
  std::vector<unsigned long long> zeros(1 << 16, 0);
  CK(cudaMemcpyToSymbol(t_end, zeros.data(), sizeof(unsigned long long) << 16));
  CK(cudaDeviceSynchronize());
}

static void launch_step(cudaStream_t st, unsigned long long spin, int *host, int pdl, int blocks) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(256);
  cfg.stream = st;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = pdl ? 1 : 0;
  CK(cudaLaunchKernelEx(&cfg, step_kernel, spin, (volatile int *)host, 1));
}

static cudaGraphExec_t capture(cudaStream_t st, int kernels, unsigned long long spin, int *host,
                               int blocks) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int k = 0; k < kernels; k++) launch_step(st, spin, k == kernels - 1 ? host : NULL, k > 0, blocks);
  // (every kernel triggers and waits in its body; the attribute makes the second an early launch)
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphDestroy(g));
  return ge;
}

int main(int argc, char **argv) {
  const double spin_us = argc > 1 ? atof(argv[1]) : 20.0;
  const int N = argc > 2 ? atoi(argv[2]) : 2000;
  const unsigned long long spin = (unsigned long long)(spin_us * 1e3);
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  printf("graph_gap: %s, kernels spin %.1f us, %d steps a variant; gaps in us from a kernel's last"
         " block's end to the next kernel's block 0 start (median mean p10 p90)\n",
         p.name, spin_us, N);
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  int *h_ids, *h_map, *d_ids, *d_map;
  CK(cudaHostAlloc((void **)&h_ids, 4096, cudaHostAllocDefault));
  CK(cudaHostAlloc((void **)&h_map, 4096, cudaHostAllocMapped));
  CK(cudaHostGetDevicePointer((void **)&d_map, h_map, 0));
  CK(cudaMalloc((void **)&d_ids, 4096));
  cudaEvent_t ev[2];
  for (int i = 0; i < 2; i++) CK(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming));
  const int blocks[2] = {1, 132};
  for (int bi = 0; bi < 2; bi++) {
    const int B = blocks[bi];
    cudaGraphExec_t g1 = capture(st, 1, spin, NULL, B), g1m = capture(st, 1, spin, d_map, B),
                    g2 = capture(st, 2, spin, NULL, B);
    static const char *names[5] = {"graph", "graph+copy", "graph+event", "two-kernel", "one-ahead"};
    for (int v = 0; v < 5; v++) {
      reset();
      for (int i = 0; i < N; i++) {
        CK(cudaGraphLaunch(v == 2 ? g1m : v == 3 ? g2 : g1, st));
        if (v == 1 || v == 4) CK(cudaMemcpyAsync(h_ids, d_ids, 4, cudaMemcpyDeviceToHost, st));
        if (v == 1 || v == 2 || v == 4) CK(cudaEventRecord(ev[i & 1], st));
        if (v == 4 && i > 0) CK(cudaEventSynchronize(ev[(i - 1) & 1])); // the host one step ahead
      }
      CK(cudaStreamSynchronize(st));
      unsigned n = 0;
      CK(cudaMemcpyFromSymbol(&n, n_launch, sizeof n));
      const gaps g = stats(gaps_of(n / 10, n, 1, 0));
      printf("%-12s blocks %3d  %7.2f %7.2f %7.2f %7.2f\n", names[v], B, g.med, g.mean, g.p10, g.p90);
      if (v == 3) // inside the graph (kernel 0 -> 1: even launches) and between replays (odd)
        printf("  two-kernel: inside a graph %.2f us, between replays %.2f us (medians)\n",
               stats(gaps_of(n / 10, n, 2, 0)).med, stats(gaps_of(n / 10, n, 2, 1)).med);
    }
    CK(cudaGraphExecDestroy(g1));
    CK(cudaGraphExecDestroy(g1m));
    CK(cudaGraphExecDestroy(g2));
  }
  return 0;
}

/* Host time of cudaGraphLaunch when calls cycle through R distinct executable graphs (R = 1:
 * the same graph every call, as a replay floor issues it) instead of one: a cached call whose key
 * holds a pointer that changes (GroupedLinear's device splits from a ring of tensors) launches
 * one of R graphs in turn. Each graph is one kernel node with P bytes of parameters (the grouped
 * GEMM's parameter block is about 1 KB), made by stream capture as lutra makes them; batches of
 * 200 launches, a stream sync between batches, the median of 15 batches.
 *   nvcc -std=c++17 -arch=sm_90 -O2 bench/graph_ring.cu -o build/graph_ring && build/graph_ring */
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "support/checks.h"

template <int P> struct Params {
  int *flag;
  char pad[P - sizeof(int *)];
};

template <int P> __global__ void k_empty(Params<P> p) {
  if (p.flag && threadIdx.x == 1024) *p.flag = p.pad[0];
}

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <int P> static int ring(cudaStream_t s, int R, int calls, int batches, double &us) {
  std::vector<cudaGraphExec_t> execs(R);
  for (int i = 0; i < R; i++) {
    Params<P> p{};
    p.flag = nullptr;
    p.pad[0] = static_cast<char>(i);
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    k_empty<P><<<1, 32, 0, s>>>(p);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&execs[i], g, 0));
    CK(cudaGraphDestroy(g));
    CK(cudaGraphLaunch(execs[i], s)); /* the upload, outside the timing */
  }
  CK(cudaStreamSynchronize(s));
  std::vector<double> t;
  for (int b = 0; b < batches; b++) {
    CK(cudaStreamSynchronize(s));
    const double t0 = now();
    for (int c = 0; c < calls; c++)
      if (cudaGraphLaunch(execs[c % R], s) != cudaSuccess) return 1;
    t.push_back((now() - t0) / calls);
  }
  CK(cudaStreamSynchronize(s));
  for (auto e : execs)
    CK(cudaGraphExecDestroy(e));
  std::sort(t.begin(), t.end());
  us = t[t.size() / 2] * 1e6;
  return 0;
}

int main() {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaFree(nullptr));
  printf("| graphs in turn | us a launch, 64 B params | us, 1 KB params | us, 4 KB params |\n");
  printf("|---:|---:|---:|---:|\n");
  for (int R : {1, 2, 4, 8, 16, 32, 64, 256}) {
    double a = 0, b = 0, c = 0;
    if (ring<64>(s, R, 200, 15, a) || ring<1024>(s, R, 200, 15, b) || ring<4096>(s, R, 200, 15, c))
      return 1;
    printf("| %d | %.2f | %.2f | %.2f |\n", R, a, b, c);
  }
  return 0;
}

/* Runs the tiled quantizers' MXFP8 kernels and their per-tensor cast + transpose
 * (kernels/quantize_tile64.cu, kernels/quantize_mx16.cu) on the CPU, one
 * std::thread per CUDA thread, and compares every output byte with the CPU backend
 * (lutra_cpu_quantize_mxfp8, lutra_cpu_cast): for checking the kernels' indexing, shuffles and
 * barriers on a machine without a GPU. FP8 conversions take
 * common.cuh's integer path here (the host has no cvt instruction), so the hardware conversions
 * themselves are left to the GPU specs.
 *
 *   make CUDA=0 && make sim-mx    (tools/sim_quantize_mx, run by the target) */
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

/* ---- the CUDA device model ------------------------------------------------------------------ */

#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __shared__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__      static
#define __launch_bounds__(...)

struct SimBlock {
  int nthreads;
  std::barrier<> *block_bar;
  std::vector<std::barrier<> *> warp_bar;
  std::vector<uint64_t> slots; /* one per thread, for shuffles and votes */
  std::vector<unsigned char> smem;
};

static thread_local uint3 sim_tid, sim_bid;
static thread_local SimBlock *sim_blk;
static dim3 sim_grid, sim_block;
#define threadIdx sim_tid
#define blockIdx  sim_bid
#define gridDim   sim_grid
#define blockDim  sim_block

static unsigned char *dyn_smem() {
  return sim_blk->smem.data();
}
static void __syncthreads() {
  sim_blk->block_bar->arrive_and_wait();
}

template <typename T> static T __shfl_xor_sync(unsigned, T v, int m) {
  static_assert(sizeof(T) <= 8, "shuffle of a wide type");
  const int t = (int)sim_tid.x, lane = t & 31, w = t >> 5;
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof v);
  sim_blk->slots[t] = bits;
  sim_blk->warp_bar[w]->arrive_and_wait();
  bits = sim_blk->slots[32 * w + (lane ^ m)];
  sim_blk->warp_bar[w]->arrive_and_wait();
  T r;
  memcpy(&r, &bits, sizeof r);
  return r;
}

static int __any_sync(unsigned, int p) {
  const int t = (int)sim_tid.x, w = t >> 5;
  sim_blk->slots[t] = p != 0;
  sim_blk->warp_bar[w]->arrive_and_wait();
  int any = 0;
  for (int l = 0; l < 32; l++)
    any |= (int)sim_blk->slots[32 * w + l];
  sim_blk->warp_bar[w]->arrive_and_wait();
  return any;
}

static unsigned __vmaxu2(unsigned a, unsigned b) {
  const unsigned lo = std::max(a & 0xFFFFu, b & 0xFFFFu), hi = std::max(a >> 16, b >> 16);
  return lo | hi << 16;
}

static unsigned __byte_perm(unsigned a, unsigned b, unsigned s) {
  const uint64_t v = (uint64_t)b << 32 | a;
  unsigned r = 0;
  for (int i = 0; i < 4; i++)
    r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return r;
}

template <typename T> static T __ldg(const T *p) {
  return *p;
}

static std::mutex sim_atomic;
static int atomicMax(int *p, int v) {
  std::lock_guard<std::mutex> g(sim_atomic);
  const int o = *p;
  *p = std::max(o, v);
  return o;
}
static int atomicCAS(int *p, int c, int v) {
  std::lock_guard<std::mutex> g(sim_atomic);
  const int o = *p;
  if (o == c) *p = v;
  return o;
}
/* the dbias reduction of k_tile64 (never run here: MXFP8 takes no bias gradient) only has to
 * compile */
static unsigned atomicAdd(unsigned *p, unsigned v) {
  std::lock_guard<std::mutex> g(sim_atomic);
  const unsigned o = *p;
  *p = o + v;
  return o;
}
static void __threadfence() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
}
template <typename T> static T __ldcg(const T *p) {
  return *p;
}
static float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
static int64_t min(int64_t a, int64_t b) {
  return a < b ? a : b;
}

/* The grid runs block after block; a block's threads run concurrently. */
template <typename K, typename... A>
static void sim_launch(K kernel, unsigned grid, unsigned block, size_t smem, cudaStream_t,
                       A... args) {
  sim_grid = dim3(grid);
  sim_block = dim3(block);
  for (unsigned b = 0; b < grid; b++) {
    SimBlock blk;
    blk.nthreads = (int)block;
    std::barrier<> bar((std::ptrdiff_t)block);
    blk.block_bar = &bar;
    std::vector<std::unique_ptr<std::barrier<>>> wb;
    for (unsigned w = 0; w < (block + 31) / 32; w++) {
      wb.emplace_back(new std::barrier<>(32));
      blk.warp_bar.push_back(wb.back().get());
    }
    blk.slots.assign(block, 0);
    blk.smem.assign(smem ? smem : 16, 0xA5); /* not zero: reads of unwritten bytes show */
    std::vector<std::thread> th;
    for (unsigned t = 0; t < block; t++)
      th.emplace_back([&, t] {
        sim_tid = make_uint3(t, 0, 0);
        sim_bid = make_uint3(b, 0, 0);
        sim_blk = &blk;
        kernel(args...);
      });
    for (auto &x : th)
      x.join();
  }
}
#define LKC_LAUNCH(kernel, grid, block, smem, stream, ...)                                         \
  sim_launch(kernel, (grid), (block), (smem), (stream), __VA_ARGS__)
#define LKC_SIM 1

/* the runtime calls the launchers make: a small device (3 SMs, 2 blocks each), so that the
 * persistent kernels loop over several tiles per block */
extern "C" {
cudaError_t cudaGetLastError(void) {
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) {
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr, int) {
  *v = 3;
  return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, const void *, int, size_t) {
  *n = 2;
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void *, cudaFuncAttribute, int) {
  return cudaSuccess;
}
cudaError_t lk_dbias_reduce(const float *, int64_t, int64_t, void *, int, int, const int32_t *,
                            cudaStream_t) {
  return cudaErrorNotSupported;
}
}

/* the three in one translation unit: their file-local (anonymous namespace) names must differ */
#include "quantize_block.cu"
#include "quantize_mx16.cu"
#include "quantize_tile64.cu"

/* ---- the check ------------------------------------------------------------------------------ */

extern "C" int lutra_cpu_quantize_mxfp8(const lutra_quant_args *a);
extern "C" int lutra_cpu_cast(const lutra_quant_args *a);

static uint16_t to16(int dt, float f) {
  return (uint16_t)(dt == LUTRA_BF16 ? lkc::bf16_bits(f) : lkc::f16_bits(f));
}

struct Outs {
  std::vector<uint8_t> data, sc, col, csc;
};

static int failures = 0, checks = 0;

static bool same_bytes(const char *what, const char *name, const std::vector<uint8_t> &cpu,
                       const std::vector<uint8_t> &sim) {
  for (size_t i = 0; i < cpu.size(); i++) {
    if (cpu[i] != sim[i]) {
      printf("FAIL %s: %s[%zu] cpu %02x sim %02x\n", what, name, i, cpu[i], sim[i]);
      failures++;
      return false;
    }
  }
  return true;
}

/* a rows x cols input of dtype xd: magnitudes vary by 32-column block so that scales differ;
 * special 1/2 add NaN, inf, subnormals, zeros and huge values (2: whole zero blocks), 3 blocks
 * around 2^-127 * fp8_max */
static std::vector<unsigned char> make_input(int xd, int64_t rows, int64_t cols, int special,
                                             uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  const int64_t n = rows * cols;
  const int esz = xd == LUTRA_F32 ? 4 : 2;
  std::vector<unsigned char> x((size_t)(n * esz + 16));
  const float tiny[] = {1e-40f, 3e-39f, 6e-8f, 1e-5f}; /* f32 / bf16 and f16 subnormals */
  for (int64_t i = 0; i < n; i++) {
    const int64_t r = i / cols, c = i % cols;
    /* special 3: blocks around 2^-127 * fp8_max, where the E8M0 scale meets subnormals */
    const int ex = special == 3 ? -100 - (int)((r * 7 + c / 32 * 3) % 40)
                                : (int)((r * 7 + c / 32 * 3) % 40) - 20;
    float v = nd(rng) * std::ldexp(1.0f, ex);
    if (special == 1 || special == 2) {
      const float u = ud(rng);
      if (u < 0.002f)
        v = NAN;
      else if (u < 0.004f)
        v = -NAN;
      else if (u < 0.006f)
        v = (u < 0.005f) ? INFINITY : -INFINITY;
      else if (u < 0.02f)
        v = tiny[(int)(u * 1000) % 4] * (u < 0.013f ? -1.0f : 1.0f);
      else if (u < 0.03f)
        v = 0.0f;
      else if (u < 0.035f)
        v = -0.0f;
      else if (u < 0.04f)
        v = 3e38f;
    }
    if (special == 2 && (r / 32 + c / 32) % 3 == 0) v = 0.0f; /* whole zero blocks */
    if (special == 4 && (r / 32 + c / 32) % 3 == 0) v = NAN;  /* whole NaN blocks */
    if (special == 5) v = (i & 1) ? NAN : -NAN;               /* nothing but NaN */
    if (xd == LUTRA_F32)
      memcpy(&x[(size_t)(i * 4)], &v, 4);
    else {
      const uint16_t h = to16(xd, v);
      memcpy(&x[(size_t)(i * 2)], &h, 2);
    }
  }
  return x;
}

/* the arguments both devices get: x, its dtype and shape, the FP8 dtype; outputs are set by the
 * caller */
static lutra_quant_args input_args(const std::vector<unsigned char> &x, int xd, int od,
                                   int64_t rows, int64_t cols) {
  lutra_quant_args q;
  memset(&q, 0, sizeof q);
  q.x = x.data();
  q.x_dtype = xd;
  q.out_dtype = od;
  q.rows = rows;
  q.cols = cols;
  return q;
}

static void run_case(int xd, int od, int64_t rows, int64_t cols, bool row, bool col, int special,
                     int skip, uint32_t seed) {
  const int64_t n = rows * cols;
  std::vector<unsigned char> x = make_input(xd, rows, cols, special, seed);
  Outs o[2];
  for (int d = 0; d < 2; d++) {
    o[d].data.assign(row ? (size_t)n : 0, 0xCD);
    o[d].sc.assign(row ? (size_t)(rows * (cols / 32)) : 0, 0xCD);
    o[d].col.assign(col ? (size_t)n : 0, 0xCD);
    o[d].csc.assign(col ? (size_t)(cols * (rows / 32)) : 0, 0xCD);
  }
  int32_t skipv = skip;
  for (int d = 0; d < 2; d++) {
    lutra_quant_args q = input_args(x, xd, od, rows, cols);
    if (row) {
      q.data = o[d].data.data();
      q.scale_inv = o[d].sc.data();
    }
    if (col) {
      q.col_data = o[d].col.data();
      q.col_scale_inv = o[d].csc.data();
    }
    q.skip = skip >= 0 ? &skipv : nullptr;
    const int rc = d == 0 ? lutra_cpu_quantize_mxfp8(&q) : (int)lk_quantize_mxfp8(&q, nullptr);
    if (rc != 0) {
      printf("FAIL rc %d (device %d)\n", rc, d);
      failures++;
      return;
    }
  }
  checks++;
  const char *names[] = {"codes", "scales", "col codes", "col scales"};
  std::vector<uint8_t> Outs::*fields[] = {&Outs::data, &Outs::sc, &Outs::col, &Outs::csc};
  char what[160];
  snprintf(what, sizeof what, "mxfp8 x%d od%d %lldx%lld row %d col %d special %d skip %d", xd, od,
           (long long)rows, (long long)cols, row, col, special, skip);
  for (int f = 0; f < 4; f++)
    if (!same_bytes(what, names[f], o[0].*fields[f], o[1].*fields[f])) return;
}

/* The per-tensor cast + transpose (lkc::cast_transpose: k_cast16 for 16-bit inputs whose dims
 * are multiples of 16, k_tile64 otherwise) against lutra_cpu_cast: codes, amax, scale_inv. */
static void run_cast_case(int xd, int od, int64_t rows, int64_t cols, bool row, float scale,
                          int special, uint32_t seed) {
  const int64_t n = rows * cols;
  std::vector<unsigned char> x = make_input(xd, rows, cols, special, seed);
  Outs o[2];
  float amax[2], sinv[2][2];
  for (int d = 0; d < 2; d++) {
    o[d].data.assign(row ? (size_t)n : 0, 0xCD);
    o[d].col.assign((size_t)n, 0xCD);
    amax[d] = 0.25f; /* a running amax from an earlier cast: the new one is max'ed into it */
    sinv[d][0] = sinv[d][1] = -1.0f;
    lutra_quant_args q = input_args(x, xd, od, rows, cols);
    if (row) q.data = o[d].data.data();
    q.col_data = o[d].col.data();
    q.scale = &scale;
    q.amax = &amax[d];
    q.scale_inv = &sinv[d][0];
    q.col_scale_inv = &sinv[d][1];
    const int rc = d == 0 ? lutra_cpu_cast(&q) : (int)lkc::cast_transpose(&q, nullptr);
    if (rc != 0) {
      printf("FAIL cast rc %d (device %d)\n", rc, d);
      failures++;
      return;
    }
  }
  checks++;
  char what[160];
  snprintf(what, sizeof what, "cast x%d od%d %lldx%lld row %d scale %g special %d", xd, od,
           (long long)rows, (long long)cols, row, scale, special);
  if (!same_bytes(what, "codes", o[0].data, o[1].data) ||
      !same_bytes(what, "col codes", o[0].col, o[1].col))
    return;
  if (memcmp(amax, amax + 1, sizeof amax[0]) != 0 ||
      memcmp(sinv[0], sinv[1], sizeof sinv[0]) != 0) {
    printf("FAIL %s: amax cpu %g sim %g, scale_inv cpu %g / %g sim %g / %g\n", what, amax[0],
           amax[1], sinv[0][0], sinv[0][1], sinv[1][0], sinv[1][1]);
    failures++;
  }
}

int main(int argc, char **argv) {
  const bool quick = argc > 1 && !strcmp(argv[1], "quick");
  const int64_t shapes[][2] = {{32, 32},   {64, 96},  {96, 160},  {128, 64},
                               {160, 224}, {288, 96}, {256, 320}, {416, 352}};
  uint32_t seed = 1;
  for (int xd : {LUTRA_BF16, LUTRA_F16, LUTRA_F32})
    for (int od : {LUTRA_E4M3, LUTRA_E5M2})
      for (auto &s : shapes) {
        if (quick && s[0] * s[1] > 40000) continue;
        for (int special = 0; special < 4; special++)
          run_case(xd, od, s[0], s[1], true, true, special, -1, seed++);
        run_case(xd, od, s[0], s[1], true, false, 1, -1, seed++);
        run_case(xd, od, s[0], s[1], false, true, 1, -1, seed++);
        run_case(xd, od, s[0], s[1], true, true, 1, 0, seed++);
        run_case(xd, od, s[0], s[1], true, true, 1, 1, seed++);
      }
  const int64_t cast_shapes[][2] = {{16, 16},  {48, 80}, {144, 272},
                                    {160, 96}, {20, 36}, {400, 208}};
  for (int xd : {LUTRA_BF16, LUTRA_F16, LUTRA_F32})
    for (int od : {LUTRA_E4M3, LUTRA_E5M2})
      for (auto &s : cast_shapes) {
        if (quick && s[0] * s[1] > 40000) continue;
        for (int special : {0, 1, 4, 5})
          for (float scale : {1.0f, 37.5f})
            run_cast_case(xd, od, s[0], s[1], true, scale, special, seed++);
        run_cast_case(xd, od, s[0], s[1], false, 3.0f, 1, seed++);
        run_cast_case(xd, od, s[0], s[1], true, INFINITY, 1, seed++);
        run_cast_case(xd, od, s[0], s[1], true, 0.0f, 1, seed++);
      }
  printf("%d passed, %d failed\n", checks - failures, failures);
  return failures != 0;
}

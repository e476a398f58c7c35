/* Runs the rowwise-scaling kernels (kernels/quantize/quantize_rowwise.cu) and their dequantization
 * (kernels/quantize/quantize.cu's LUTRA_SCALING_ROWWISE case) on the CPU, one std::thread per CUDA
 * thread, and compares every output byte (the rowwise codes and their scale inverses, the
 * columnwise codes and theirs; the dequantized values) with the CPU backend's
 * lutra_cpu_quantize_rowwise and lutra_cpu_dequantize: odd shapes (rows and columns no multiple of
 * 16 or of the 64-wide tiles, one row, one column, empty), the vector and the scalar row paths (an
 * unaligned input), f32, bf16 and f16 inputs, E4M3 and E5M2, power-of-two scales or not,
 * amax_epsilon, both copies or one, rows and columns of zeros (amax 0: the rule's epsilon / zero
 * case), inf, NaN, huge and subnormal values, and skip set (nothing written) or clear. For the
 * kernels' indexing, barriers and atomics on a machine without a GPU; FP8 conversions take
 * common/codec.cuh's integer path here.
 *
 *   make CUDA=0 && make sim-rowwise */
#include "sim_harness.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>

#define LKC_LAUNCH SIM_LAUNCH

/* the helper library at file scope (the kernel files below include it inside namespaces) */
#include "common/base.cuh"
#include "common/codec.cuh"
#include "common/elements.cuh"
#include "common/f32.cuh"
#include "common/launch.cuh"
#include "common/reduce.cuh"
#include "common/scale.cuh"
#include "kernels.h"
#include "quantize/cast_transpose.cuh"
#include <math.h> /* before quantize.cu includes it inside a namespace */

/* the two in one translation unit: their file-local names must differ */
namespace sim_quantize {
#include "quantize/quantize.cu"
}
namespace sim_rowwise {
#include "quantize/quantize_rowwise.cu"
}

/* what quantize.cu's other launchers call, defined in files this sim does not take */
extern "C" cudaError_t lk_dequantize_nvfp4(const lutra_dequant_args *, cudaStream_t) {
  return cudaErrorNotSupported;
}
extern "C" cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind,
                                       cudaStream_t) {
  memcpy(dst, src, n);
  return cudaSuccess;
}
namespace lkc {
cudaError_t cast_transpose(const lutra_quant_args *, cudaStream_t) {
  return cudaErrorNotSupported;
}
} // namespace lkc

/* ---- the check ------------------------------------------------------------------------------ */

#include "sim_cpu.h"

static int failures = 0, checks = 0;
using Bytes = std::vector<unsigned char>;

static void same(const Bytes &got, const Bytes &want, const char *what, const char *name) {
  checks++;
  if (got == want) return;
  size_t i = 0;
  while (i < got.size() && got[i] == want[i])
    i++;
  printf("FAIL %s: %s differs at byte %zu of %zu (%02x vs %02x)\n", name, what, i, want.size(),
         got[i], want[i]);
  failures++;
}

struct Case {
  int64_t rows, cols;
  int x_dtype, out_dtype;
  bool rowwise, columnwise;
  int p2;
  float eps;
  bool unaligned; /* x one element past a 16-byte boundary: the scalar row path */
  int special;    /* 0: none, 1: zero rows and columns, 2: inf/NaN/huge/subnormal values */
  int skip;       /* -1: no flag, 0: flag clear, 1: flag set */
};

static void fill(const Case &c, unsigned char *x, std::mt19937_64 &rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t rows = c.rows, cols = c.cols;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t k = 0; k < cols; k++) {
      /* rows and columns of different magnitudes, so that every scale differs */
      float v = nd(rng) * ldexpf(1.0f, (int)(r % 9) - 4) * ldexpf(1.0f, (int)(k % 5) - 2);
      if (c.special == 1 && (r % 3 == 1 || k % 4 == 2)) v = (r + k) % 2 ? -0.0f : 0.0f;
      if (c.special == 2) {
        const int64_t h = (r * 31 + k * 17) % 23;
        if (h == 0) v = INFINITY;
        if (h == 1) v = -NAN;
        if (h == 2) v = NAN;
        if (h == 3) v = 3.0e38f * (r % 2 ? -1.0f : 1.0f);
        if (r % 5 == 4) v = v * 1e-42f; /* subnormal rows in f32 (zero in bf16/f16) */
      }
      std::vector<unsigned char> one(4);
      sim_put(one, c.x_dtype, 0, v);
      memcpy(x + (r * cols + k) * sim_esize(c.x_dtype), one.data(), sim_esize(c.x_dtype));
    }
}

static void run_case(const Case &c, uint64_t seed) {
  char name[200];
  snprintf(name, sizeof name, "%lldx%lld %s->%s%s%s p2=%d eps=%g%s special=%d skip=%d",
           (long long)c.rows, (long long)c.cols, lutra_dtype_name(c.x_dtype),
           lutra_dtype_name(c.out_dtype), c.rowwise ? " rowwise" : "",
           c.columnwise ? " columnwise" : "", c.p2, (double)c.eps, c.unaligned ? " unaligned" : "",
           c.special, c.skip);
  std::mt19937_64 rng(seed);
  const int64_t n = c.rows * c.cols;
  const int es = sim_esize(c.x_dtype);
  Bytes xbuf((size_t)(n + 8) * es + 32);
  unsigned char *x =
      xbuf.data() + (16 - (uintptr_t)xbuf.data() % 16) % 16 + (c.unaligned ? (size_t)es : 0);
  fill(c, x, rng);
  /* poisoned outputs: what is not written keeps 0xEE */
  Bytes data[2], col[2], sinv[2], csinv[2];
  for (int k = 0; k < 2; k++) {
    data[k].assign((size_t)n + 16, 0xEE);
    col[k].assign((size_t)n + 16, 0xEE);
    sinv[k].assign((size_t)c.rows * 4 + 16, 0xEE);
    csinv[k].assign((size_t)c.cols * 4 + 16, 0xEE);
  }
  const int32_t flag = c.skip > 0 ? 1 : 0;
  for (int k = 0; k < 2; k++) {
    lutra_quant_args a{};
    a.x = x;
    a.x_dtype = c.x_dtype;
    a.out_dtype = c.out_dtype;
    a.rows = c.rows;
    a.cols = c.cols;
    /* 16-byte aligned outputs (vectors() of a std::vector<unsigned char> need not be) */
    auto al = [](Bytes &b) { return b.data() + (16 - (uintptr_t)b.data() % 16) % 16; };
    if (c.rowwise) {
      a.data = al(data[k]);
      a.scale_inv = al(sinv[k]);
    }
    if (c.columnwise) {
      a.col_data = al(col[k]);
      a.col_scale_inv = al(csinv[k]);
    }
    a.power_2_scale = c.p2;
    a.amax_epsilon = c.eps;
    a.skip = c.skip < 0 ? nullptr : &flag;
    if (k == 0) {
      if (cpu::lutra_cpu_quantize_rowwise(&a) != LUTRA_OK) {
        printf("FAIL %s: the CPU backend refused: %s\n", name, lutra_last_error());
        failures++;
        return;
      }
    } else if (lk_quantize_rowwise(&a, nullptr) != cudaSuccess) {
      printf("FAIL %s: the launcher refused\n", name);
      failures++;
      return;
    }
  }
  same(data[1], data[0], "rowwise codes", name);
  same(sinv[1], sinv[0], "rowwise scale_inv", name);
  same(col[1], col[0], "columnwise codes", name);
  same(csinv[1], csinv[0], "columnwise scale_inv", name);
  if (c.skip > 0) { /* the reference wrote nothing either: check that it is still the poison */
    checks++;
    for (const Bytes *b : {&data[1], &col[1], &sinv[1], &csinv[1]})
      for (unsigned char v : *b)
        if (v != 0xEE) {
          printf("FAIL %s: a byte was written with skip set\n", name);
          failures++;
          return;
        }
    return;
  }
  /* the dequantization of each copy written, to f32 and bf16 */
  auto al = [](Bytes &b) { return b.data() + (16 - (uintptr_t)b.data() % 16) % 16; };
  for (int copy = 0; copy < 2; copy++) {
    if (copy == 0 ? !c.rowwise : !c.columnwise) continue;
    if (n == 0) continue;
    for (int od : {LUTRA_F32, LUTRA_BF16}) {
      Bytes out[2];
      for (int k = 0; k < 2; k++) {
        out[k].assign((size_t)n * sim_esize(od) + 16, 0xEE);
        lutra_dequant_args d{};
        d.data = copy == 0 ? al(data[1]) : al(col[1]);
        d.scale_inv = copy == 0 ? al(sinv[1]) : al(csinv[1]);
        d.dtype = c.out_dtype;
        d.scaling = LUTRA_SCALING_ROWWISE;
        d.rows = copy == 0 ? c.rows : c.cols;
        d.cols = copy == 0 ? c.cols : c.rows;
        d.out = al(out[k]);
        d.out_dtype = od;
        if (k == 0 ? cpu::lutra_cpu_dequantize(&d) != LUTRA_OK
                   : lk_dequantize(&d, nullptr) != cudaSuccess) {
          printf("FAIL %s: dequantize refused (%s)\n", name, k == 0 ? "cpu" : "kernel");
          failures++;
          return;
        }
      }
      same(out[1], out[0], od == LUTRA_F32 ? "dequantized f32" : "dequantized bf16", name);
    }
  }
}

int main(int argc, char **argv) {
  const bool quick = argc > 1 && !strcmp(argv[1], "quick");
  setvbuf(stdout, nullptr, _IOLBF, 0);
  /* the vector row path (cols % 16 == 0), the scalar one, partial 64x64 tiles, the columnwise
   * word stores (rows % 4 == 0) and byte stores, one row, one column, several row slices of the
   * amax pass (rows > 256), empty shapes */
  const int64_t shapes[][2] = {{1, 1},   {1, 37},   {37, 1},   {5, 48},   {17, 33},
                               {64, 64}, {65, 129}, {130, 70}, {3, 160},  {1, 200},
                               {200, 1}, {300, 16}, {520, 24}, {0, 5},    {5, 0},
                               {0, 0},   {4, 3},    {68, 100}, {132, 40}, {16, 1}};
  uint64_t seed = 1;
  for (int xd : {LUTRA_BF16, LUTRA_F32, LUTRA_F16})
    for (int od : {LUTRA_E4M3, LUTRA_E5M2})
      for (const auto &s : shapes) {
        if (quick && xd == LUTRA_F16 && s[0] * s[1] > 2000) continue;
        Case c{s[0], s[1], xd, od, true, true, (int)(seed % 2), 0.0f, false, 0, -1};
        run_case(c, seed++);
      }
  /* one copy at a time, unaligned input, epsilon, zeros, special values, skip */
  for (int xd : {LUTRA_BF16, LUTRA_F32, LUTRA_F16})
    for (int od : {LUTRA_E4M3, LUTRA_E5M2}) {
      run_case({33, 48, xd, od, true, false, 1, 0.0f, false, 0, -1}, seed++);
      run_case({48, 33, xd, od, false, true, 0, 0.0f, false, 0, -1}, seed++);
      run_case({9, 64, xd, od, true, true, 1, 0.0f, true, 0, -1}, seed++);
      run_case({70, 96, xd, od, true, true, 1, 0.0f, false, 1, -1}, seed++);
      run_case({70, 96, xd, od, true, true, 0, 1e-3f, false, 1, 0}, seed++);
      run_case({66, 35, xd, od, true, true, 1, 0.0f, false, 2, -1}, seed++);
      run_case({66, 35, xd, od, true, true, 0, 0.0f, false, 2, -1}, seed++);
      run_case({40, 80, xd, od, true, true, 1, 0.0f, false, 0, 1}, seed++);
      run_case({0, 7, xd, od, true, true, 1, 0.5f, false, 0, -1}, seed++);
      run_case({7, 0, xd, od, true, true, 0, 0.5f, false, 0, -1}, seed++);
    }
  printf("sim_rowwise: %d checks, %d failures\n", checks, failures);
  return failures ? 1 : 0;
}

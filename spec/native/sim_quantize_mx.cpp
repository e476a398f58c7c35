/* Runs the tiled quantizers' MXFP8 kernels, their per-tensor cast + transpose
 * (kernels/quantize/cast_transpose.cu, kernels/quantize/cast_transpose_16bit.cu) and Float8 block
 * scaling (kernels/quantize/quantize_block.cu) on the CPU, one std::thread per CUDA thread, and
 * compares every output byte with the CPU backend (lutra_cpu_quantize_mxfp8, lutra_cpu_cast,
 * lutra_cpu_quantize_block): for checking the kernels' indexing, shuffles and barriers on a
 * machine without a GPU. FP8 conversions take common/codec.cuh's integer path here (the host has
 * no cvt instruction), so the hardware conversions themselves are left to the GPU specs.
 *
 *   make CUDA=0 && make sim-mx    (build/sim_quantize_mx, run by the target) */
#include "sim_harness.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>

#define LKC_LAUNCH SIM_LAUNCH

/* cast_transpose.cu's band height: CUDA's min for 64-bit integers */
static int64_t min(int64_t a, int64_t b) {
  return a < b ? a : b;
}
/* the three in one translation unit: their file-local (anonymous namespace) names must differ */
#include "quantize/cast_transpose.cu"
#include "quantize/cast_transpose_16bit.cu"
#include "quantize/quantize_block.cu"

/* ---- the check ------------------------------------------------------------------------------ */

#include "sim_cpu.h"

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

/* One scaled quantization (MXFP8 or block scaling) on both devices, the CPU first, into outputs
 * filled with 0xCD (sc_bytes / csc_bytes of scales: padding entries must stay as allocated), its
 * four outputs then compared byte for byte. set puts the quantization's own fields into q. */
template <class Set, class CpuFn, class DevFn>
static void run_scaled(const std::vector<unsigned char> &x, int xd, int od, int64_t rows,
                       int64_t cols, bool row, bool col, size_t sc_bytes, size_t csc_bytes,
                       int skip, Set set, CpuFn cpu_fn, DevFn dev_fn, const char *what) {
  const size_t n = (size_t)(rows * cols);
  Outs o[2];
  for (int d = 0; d < 2; d++) {
    o[d].data.assign(row ? n : 0, 0xCD);
    o[d].sc.assign(row ? sc_bytes : 0, 0xCD);
    o[d].col.assign(col ? n : 0, 0xCD);
    o[d].csc.assign(col ? csc_bytes : 0, 0xCD);
  }
  int32_t skipv = skip;
  for (int d = 0; d < 2; d++) {
    lutra_quant_args q = input_args(x, xd, od, rows, cols);
    set(q);
    if (row) {
      q.data = o[d].data.data();
      q.scale_inv = o[d].sc.data();
    }
    if (col) {
      q.col_data = o[d].col.data();
      q.col_scale_inv = o[d].csc.data();
    }
    q.skip = skip >= 0 ? &skipv : nullptr;
    const int rc = d == 0 ? cpu_fn(&q) : (int)dev_fn(&q, nullptr);
    if (rc != 0) {
      printf("FAIL %s: rc %d (device %d)\n", what, rc, d);
      failures++;
      return;
    }
  }
  checks++;
  const char *names[] = {"codes", "scales", "col codes", "col scales"};
  std::vector<uint8_t> Outs::*fields[] = {&Outs::data, &Outs::sc, &Outs::col, &Outs::csc};
  for (int f = 0; f < 4; f++)
    if (!same_bytes(what, names[f], o[0].*fields[f], o[1].*fields[f])) return;
}

static void run_case(int xd, int od, int64_t rows, int64_t cols, bool row, bool col, int special,
                     int skip, uint32_t seed) {
  char what[160];
  snprintf(what, sizeof what, "mxfp8 x%d od%d %lldx%lld row %d col %d special %d skip %d", xd, od,
           (long long)rows, (long long)cols, row, col, special, skip);
  run_scaled(
      make_input(xd, rows, cols, special, seed), xd, od, rows, cols, row, col,
      (size_t)(rows * (cols / 32)), (size_t)(cols * (rows / 32)), skip, [](lutra_quant_args &) {},
      cpu::lutra_cpu_quantize_mxfp8, lk_quantize_mxfp8, what);
}

/* Float8 block scaling (lk_quantize_block: 1x128 blocks or 128x128 tiles, f32 scales) against
 * lutra_cpu_quantize_block. Scale buffers as lutra.h lays them out (block_dim 1: [cols / 128
 * blocks][roundup(rows, 4)] and [row blocks][roundup(cols, 4)]; 2: [tile rows][roundup(tile cols,
 * 4)] and its transpose). */
static void run_block_case(int xd, int od, int dim, int64_t rows, int64_t cols, bool row, bool col,
                           int special, int p2, float eps, int skip, uint32_t seed) {
  const int64_t rb = (rows + 127) / 128, cb = (cols + 127) / 128;
  const int64_t nsc = dim == 1 ? cb * ((rows + 3) / 4 * 4) : rb * ((cb + 3) / 4 * 4);
  const int64_t ncsc = dim == 1 ? rb * ((cols + 3) / 4 * 4) : cb * ((rb + 3) / 4 * 4);
  char what[200];
  snprintf(what, sizeof what,
           "block%d x%d od%d %lldx%lld row %d col %d special %d p2 %d eps %g skip %d", dim, xd, od,
           (long long)rows, (long long)cols, row, col, special, p2, eps, skip);
  run_scaled(
      make_input(xd, rows, cols, special, seed), xd, od, rows, cols, row, col, (size_t)nsc * 4,
      (size_t)ncsc * 4, skip,
      [&](lutra_quant_args &q) {
        q.block_dim = dim;
        q.power_2_scale = p2;
        q.amax_epsilon = eps;
      },
      cpu::lutra_cpu_quantize_block, lk_quantize_block, what);
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
    const int rc = d == 0 ? cpu::lutra_cpu_cast(&q) : (int)lkc::cast_transpose(&q, nullptr);
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

/* The cast's fusions (lkc::cast_transpose with an activation and / or a bias gradient: k_cast16
 * for 16-bit inputs whose dims are multiples of 16 and a kind without a gate, k_tile64 otherwise)
 * against their definition: the values quantized are F = act_value (act_cast.cuh, element by
 * element) or x itself, cast by lutra_cpu_cast; codes, amax and act_out bit for bit, and the bias
 * gradient against F's column sums in double: the sums' orders differ, so within 1e-5 of the
 * column's magnitude sum (a row left out or counted twice is far outside). */
static void run_fused_case(int xd, int od, int64_t rows, int64_t cols, int act_kind, bool forward,
                           bool dbias, bool accumulate, uint32_t seed) {
  const int64_t n = rows * cols;
  const int esz = xd == LUTRA_F32 ? 4 : 2;
  std::vector<unsigned char> x = make_input(xd, rows, cols, 0, seed);
  std::vector<unsigned char> pre = make_input(xd, rows, cols, 0, seed + 7777);
  std::vector<unsigned char> f = x; /* F, the values quantized */
  std::vector<double> fv((size_t)n);
  lutra_quant_args a = input_args(x, xd, od, rows, cols);
  if (act_kind) {
    a.act = pre.data();
    a.act_kind = act_kind;
    a.act_forward = forward;
    if (forward) a.x = nullptr;
  }
  for (int64_t i = 0; i < n; i++) {
    const int64_t r = i / cols, c = i % cols;
    float v;
    if (!act_kind)
      v = xd == LUTRA_F32    ? lkc::ld<LUTRA_F32>(x.data(), i)
          : xd == LUTRA_BF16 ? lkc::ld<LUTRA_BF16>(x.data(), i)
                             : lkc::ld<LUTRA_F16>(x.data(), i);
    else
      v = xd == LUTRA_F32    ? lkact::act_value<LUTRA_F32>(a, r, c)
          : xd == LUTRA_BF16 ? lkact::act_value<LUTRA_BF16>(a, r, c)
                             : lkact::act_value<LUTRA_F16>(a, r, c);
    fv[(size_t)i] = v;
    if (xd == LUTRA_F32)
      memcpy(&f[(size_t)(i * 4)], &v, 4);
    else {
      const uint16_t h = to16(xd, v);
      memcpy(&f[(size_t)(i * 2)], &h, 2);
    }
  }
  Outs o[2];
  std::vector<unsigned char> act_out((size_t)(n * esz + 16), 0xCD);
  std::vector<float> scratch((size_t)lutra_dbias_scratch_floats(rows, cols), -1.0f);
  std::vector<float> db((size_t)cols, accumulate ? 0.5f : -7.0f);
  float scale = 2.0f, amax[2], sinv[2][2];
  for (int d = 0; d < 2; d++) {
    o[d].data.assign((size_t)n, 0xCD);
    o[d].col.assign((size_t)n, 0xCD);
    amax[d] = 0.0f;
    lutra_quant_args q = d == 0 ? input_args(f, xd, od, rows, cols) : a;
    q.data = o[d].data.data();
    q.col_data = o[d].col.data();
    q.scale = &scale;
    q.amax = &amax[d];
    q.scale_inv = &sinv[d][0];
    q.col_scale_inv = &sinv[d][1];
    if (d == 1) {
      if (act_kind) q.act_out = act_out.data();
      if (dbias) {
        q.dbias = db.data();
        q.dbias_dtype = LUTRA_F32;
        q.dbias_accumulate = accumulate;
        q.dbias_scratch = scratch.data();
      }
    }
    const int rc = d == 0 ? cpu::lutra_cpu_cast(&q) : (int)lkc::cast_transpose(&q, nullptr);
    if (rc != 0) {
      printf("FAIL fused rc %d (device %d)\n", rc, d);
      failures++;
      return;
    }
  }
  checks++;
  char what[160];
  snprintf(what, sizeof what, "fused x%d od%d %lldx%lld act %d forward %d dbias %d accumulate %d",
           xd, od, (long long)rows, (long long)cols, act_kind, forward, dbias, accumulate);
  if (!same_bytes(what, "codes", o[0].data, o[1].data) ||
      !same_bytes(what, "col codes", o[0].col, o[1].col))
    return;
  if (act_kind && memcmp(act_out.data(), f.data(), (size_t)(n * esz)) != 0) {
    printf("FAIL %s: act_out differs from the activation's values\n", what);
    failures++;
    return;
  }
  if (memcmp(amax, amax + 1, sizeof amax[0]) != 0) {
    printf("FAIL %s: amax cpu %g sim %g\n", what, amax[0], amax[1]);
    failures++;
    return;
  }
  for (int64_t c = 0; dbias && c < cols; c++) {
    double sum = accumulate ? 0.5 : 0.0, mag = accumulate ? 0.5 : 0.0;
    for (int64_t r = 0; r < rows; r++) {
      sum += fv[(size_t)(r * cols + c)];
      mag += fabs(fv[(size_t)(r * cols + c)]);
    }
    /* (f16 inputs hold infinities: their sums are infinite or NaN on both sides) */
    const bool ok = std::isnan(sum)   ? std::isnan(db[(size_t)c])
                    : std::isinf(sum) ? db[(size_t)c] == sum
                                      : fabs(db[(size_t)c] - sum) <= 1e-5 * mag + 1e-30;
    if (!ok) {
      printf("FAIL %s: dbias column %lld sim %.9g expected %.9g\n", what, (long long)c,
             db[(size_t)c], sum);
      failures++;
      return;
    }
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
  /* the fusions: bias gradients over tile rows past the reduction's 32 groups and its unrolled
   * steps, partial tiles (k_tile64) and whole ones (k_cast16), every kind without a gate */
  const int64_t fused_shapes[][2] = {{64, 64}, {1088, 192}, {600, 80}, {48, 16}, {4480, 48}};
  for (int xd : {LUTRA_F32, LUTRA_BF16, LUTRA_F16})
    for (auto &s : fused_shapes) {
      if (quick && s[0] * s[1] > 250000) continue;
      for (bool acc : {false, true})
        run_fused_case(xd, LUTRA_E5M2, s[0], s[1], 0, false, true, acc, seed++);
      run_fused_case(xd, LUTRA_E5M2, s[0], s[1], LUTRA_ACT_GELU_TANH, false, true, false, seed++);
      run_fused_case(xd, LUTRA_E4M3, s[0], s[1], LUTRA_ACT_GELU_TANH, true, false, false, seed++);
    }
  for (int kind = LUTRA_ACT_GELU_TANH; kind <= LUTRA_ACT_GELU_ERF; kind++)
    for (bool forward : {false, true})
      run_fused_case(LUTRA_BF16, LUTRA_E4M3, 256, 144, kind, forward, !forward, false, seed++);
  /* Float8 block scaling: dims multiples of 16 (k_block16 for 16-bit inputs) and not (k_block),
   * partial tiles included */
  const int64_t block_shapes[][2] = {{128, 128}, {16, 16}, {48, 80},  {144, 272}, {256, 384},
                                     {416, 352}, {20, 36}, {96, 100}, {130, 200}};
  for (int xd : {LUTRA_BF16, LUTRA_F16, LUTRA_F32})
    for (int od : {LUTRA_E4M3, LUTRA_E5M2})
      for (int dim : {1, 2})
        for (auto &s : block_shapes) {
          if (quick && s[0] * s[1] > 40000) continue;
          for (int special = 0; special < 5; special++)
            run_block_case(xd, od, dim, s[0], s[1], true, true, special, special & 1,
                           special == 2 ? 1e-3f : 0.0f, -1, seed++);
          run_block_case(xd, od, dim, s[0], s[1], true, false, 1, 0, 0.0f, -1, seed++);
          run_block_case(xd, od, dim, s[0], s[1], false, true, 1, 1, 0.0f, -1, seed++);
          run_block_case(xd, od, dim, s[0], s[1], true, true, 0, 1, 0.5f, 0, seed++);
          run_block_case(xd, od, dim, s[0], s[1], true, true, 1, 0, 0.0f, 1, seed++);
        }
  printf("%d passed, %d failed\n", checks - failures, failures);
  return failures != 0;
}

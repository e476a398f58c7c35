/* Runs the norm kernels (kernels/norm/norm.cu: forward, backward with its dgamma/dbeta passes) and
 * the fused norm + FP8 kernel (kernels/norm/norm_quantize.cu, every recipe) on the CPU, one
 * std::thread per CUDA thread, against the CPU backend (lutra_cpu_layernorm_forward/backward,
 * lutra_cpu_norm_quantize): y, mean, rstd, dx, the codes of both copies, their scales, amax and
 * scale byte for byte; dgamma/dbeta (a column sum in another order by design) within a relative
 * bound of 1e-6 per column and bit for bit between two runs. For checking the kernels' indexing,
 * shuffles and barriers on a machine without a GPU; FP8 conversions take common/codec.cuh's integer
 * path here, so the hardware conversions are left to the GPU specs.
 *
 *   make CUDA=0 && make sim-norm ARGS=quick    (build/sim_norm, run by the target) */
#include "sim_harness.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>

#define LKC_LAUNCH SIM_LAUNCH

/* the helper library at file scope (the kernel files below include it inside namespaces) */
#include "common/base.cuh"
#include "common/bulk_rows.cuh"
#include "common/codec.cuh"
#include "common/elements.cuh"
#include "common/f32.cuh"
#include "common/launch.cuh"
#include "common/reduce.cuh"
#include "common/scale.cuh"
#include "kernels.h"

/* the quantizer's tile kernels, which the fused norm + FP8 cast also launches (normalizing as
 * they load): their declarations at file scope, their files after the norm's (the two norm files
 * in one translation unit: their file-local names must differ) */
#include "quantize/quantize_tiles.cuh"

namespace sim_norm_rows {
#include "norm/norm.cu"
}
/* per-tensor scaling's tile path from 8192 elements (the GPU's 4M): the 16-bit fused shapes
 * below with both dims multiples of 16 and 8192 elements or more ([96, 320], [32, 4096],
 * [16, 12288]) take it where the statistics are kept and both copies are asked for */
#define LK_TILE_MIN_TENSOR_ELEMS 8192
namespace sim_norm_fused {
#include "norm/norm_quantize.cu"
}
#include "quantize/cast_transpose_16bit.cu"
#include "quantize/quantize_block.cu"

/* ---- the check ------------------------------------------------------------------------------ */

#include "sim_cpu.h"

static int failures = 0, checks = 0;
using Bytes = std::vector<unsigned char>;

static bool same(const char *what, const char *name, const Bytes &cpu, const Bytes &sim) {
  checks++;
  if (cpu.size() == sim.size() && memcmp(cpu.data(), sim.data(), cpu.size()) == 0) return true;
  size_t i = 0;
  while (i < cpu.size() && cpu[i] == sim[i])
    i++;
  printf("FAIL %s: %s byte %zu of %zu: cpu %02x sim %02x\n", what, name, i, cpu.size(),
         i < cpu.size() ? cpu[i] : 0, i < sim.size() ? sim[i] : 0);
  failures++;
  return false;
}

/* n values of dtype dt, normal(mu, sd); buffers start 16-byte aligned (std::vector's new) */
static Bytes values(int dt, int64_t n, float mu, float sd, std::mt19937 &rng) {
  std::normal_distribution<float> nd(mu, sd);
  Bytes v((size_t)(n * sim_esize(dt) + 16), 0);
  for (int64_t i = 0; i < n; i++)
    sim_put(v, dt, i, nd(rng));
  return v;
}

struct Shape {
  int64_t rows, hidden;
};

/* the norm of x (inputs set, outputs not), eps 1e-5 */
static lutra_norm_args norm_args(const Bytes &x, const Bytes &g, const Bytes &b, int dt, int pdt,
                                 const Shape &s, bool rms, bool zc) {
  lutra_norm_args a;
  memset(&a, 0, sizeof a);
  a.x = x.data();
  a.gamma = g.data();
  a.beta = b.data();
  a.dtype = dt;
  a.param_dtype = pdt;
  a.rows = s.rows;
  a.hidden = s.hidden;
  a.eps = 1e-5f;
  a.rms = rms;
  a.zero_centered_gamma = zc;
  return a;
}

/* forward and backward of one norm on both devices */
static void run_norm(int dt, int pdt, const Shape &s, bool rms, bool zc, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t n = s.rows * s.hidden;
  Bytes x = values(dt, n, 0.5f, 2.0f, rng), dy = values(dt, n, 0.0f, 1.0f, rng);
  Bytes g = values(pdt, s.hidden, zc ? 0.0f : 1.0f, 0.3f, rng);
  Bytes b = values(pdt, s.hidden, 0.0f, 0.3f, rng);
  /* a residual's gradient added to dx in every other case (lutra_norm_args.dx_add) */
  const bool add = (seed >> 1) & 1;
  Bytes res = values(dt, n, 0.0f, 1.0f, rng);
  char what[160];
  snprintf(what, sizeof what, "%s dt%d pdt%d [%lld, %lld]%s%s", rms ? "rmsnorm" : "layernorm", dt,
           pdt, (long long)s.rows, (long long)s.hidden, zc ? " zc" : "", add ? " +dx_add" : "");
  Bytes y[2], mean[2], rstd[2], dx[2], dg[3], db[3];
  for (int d = 0; d < 2; d++) {
    y[d].assign((size_t)(n * sim_esize(dt)), 0xCD);
    dx[d].assign((size_t)(n * sim_esize(dt)), 0xCD);
    mean[d].assign((size_t)s.rows * 4, 0xCD);
    rstd[d].assign((size_t)s.rows * 4, 0xCD);
  }
  for (int d = 0; d < 3; d++) {
    dg[d].assign((size_t)s.hidden * sim_esize(pdt), 0xCD);
    db[d].assign((size_t)s.hidden * sim_esize(pdt), 0xCD);
  }
  std::vector<double> partial(LK_BIAS_PARTIALS, -1.0);
  lk_scratch scratch;
  memset(&scratch, 0, sizeof scratch);
  scratch.bias_partial = partial.data();
  const lutra_norm_args the_norm = norm_args(x, g, b, dt, pdt, s, rms, zc);
  for (int d = 0; d < 2; d++) {
    lutra_norm_args a = the_norm;
    a.y = y[d].data();
    a.mean = reinterpret_cast<float *>(mean[d].data());
    a.rstd = reinterpret_cast<float *>(rstd[d].data());
    const int rc = d == 0 ? cpu::lutra_cpu_layernorm_forward(&a)
                          : (int)sim_norm_rows::lk_layernorm_forward(&a, 0);
    if (rc != 0) {
      printf("FAIL %s: forward rc %d (device %d)\n", what, rc, d);
      failures++;
      return;
    }
  }
  if (!same(what, "y", y[0], y[1]) || !same(what, "rstd", rstd[0], rstd[1]) ||
      (!rms && !same(what, "mean", mean[0], mean[1])))
    return;
  /* the backward from the same saved statistics on both; the device twice */
  for (int d = 0; d < 3; d++) {
    lutra_norm_args a = the_norm;
    a.mean = reinterpret_cast<float *>(mean[0].data());
    a.rstd = reinterpret_cast<float *>(rstd[0].data());
    a.dy = dy.data();
    a.dx = d < 2 ? dx[d].data() : nullptr;
    a.dx_add = add && d < 2 ? res.data() : nullptr;
    a.dgamma = dg[d].data();
    a.dbeta = rms ? nullptr : db[d].data();
    const int rc = d == 0 ? cpu::lutra_cpu_layernorm_backward(&a)
                          : (int)sim_norm_rows::lk_layernorm_backward(&a, &scratch, 0);
    if (rc != 0) {
      printf("FAIL %s: backward rc %d (device %d)\n", what, rc, d);
      failures++;
      return;
    }
  }
  if (!same(what, "dx", dx[0], dx[1]) || !same(what, "dgamma repeated", dg[1], dg[2]) ||
      (!rms && !same(what, "dbeta repeated", db[1], db[2])))
    return;
  /* the column sums: another order of the same double sums, rounded into the parameter dtype */
  checks++;
  for (int k = 0; k < (rms ? 1 : 2); k++) {
    const Bytes *v = k == 0 ? dg : db;
    double num = 0.0, den = 0.0;
    for (int64_t c = 0; c < s.hidden; c++) {
      float f[2];
      for (int d = 0; d < 2; d++) {
        if (pdt == LUTRA_F32)
          memcpy(&f[d], &v[d][(size_t)c * 4], 4);
        else {
          uint16_t h;
          memcpy(&h, &v[d][(size_t)c * 2], 2);
          f[d] = __bfloat162float(__ushort_as_bfloat16(h));
        }
      }
      num += ((double)f[0] - f[1]) * ((double)f[0] - f[1]);
      den += (double)f[0] * f[0];
    }
    const double bound = pdt == LUTRA_F32 ? 1e-12 : 1e-5;
    if (!(num <= bound * den)) {
      printf("FAIL %s: %s NMSE %g over %g\n", what, k ? "dbeta" : "dgamma", num / den, bound);
      failures++;
    }
  }
}

/* the fused norm + FP8 cast against the CPU's norm followed by its quantizer */
static void run_fused(int dt, int pdt, int od, const Shape &s, bool rms, int scaling, bool current,
                      bool row, bool col, bool want_y, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t n = s.rows * s.hidden, r4 = (s.rows + 3) / 4 * 4, h4 = (s.hidden + 3) / 4 * 4;
  /* the statistics kept for backward (the tile kernels' path for 16-bit inputs) in two cases of
   * three, else none (an inference forward: the fused kernels' own statistics); a zero-centered
   * gamma in one of four */
  const bool stats = seed % 3 != 0, zc = seed % 4 == 1;
  Bytes x = values(dt, n, 0.5f, 2.0f, rng);
  Bytes g = values(pdt, s.hidden, 1.0f, 0.3f, rng), b = values(pdt, s.hidden, 0.0f, 0.3f, rng);
  /* magnitudes varying by row and column block, so that MXFP8 and 1x128 scales differ */
  for (int64_t i = 0; i < n; i++) {
    const int64_t r = i / s.hidden, c = i % s.hidden;
    if ((r + c / 32) % 5 == 0) {
      float f;
      if (dt == LUTRA_F32)
        memcpy(&f, &x[(size_t)i * 4], 4);
      else {
        uint16_t h;
        memcpy(&h, &x[(size_t)i * 2], 2);
        f = dt == LUTRA_BF16 ? __bfloat162float(__ushort_as_bfloat16(h))
                             : __half2float(__ushort_as_half(h));
      }
      sim_put(x, dt, i, f * 37.0f);
    }
  }
  size_t sc_bytes = 4, csc_bytes = 4;
  if (scaling == LUTRA_SCALING_MXFP8) {
    sc_bytes = (size_t)(s.rows * (s.hidden / 32));
    csc_bytes = (size_t)(s.hidden * (s.rows / 32));
  } else if (scaling == LUTRA_SCALING_BLOCK_1D) {
    sc_bytes = (size_t)((s.hidden + 127) / 128 * r4 * 4);
    csc_bytes = (size_t)((s.rows + 127) / 128 * h4 * 4);
  }
  char what[200];
  snprintf(what, sizeof what,
           "%s+fp8 dt%d pdt%d od%d [%lld, %lld] scaling %d%s row %d col %d y %d stats %d zc %d",
           rms ? "rmsnorm" : "layernorm", dt, pdt, od, (long long)s.rows, (long long)s.hidden,
           scaling, current ? " current" : "", row, col, want_y, stats, zc);
  Bytes y[2], mean[2], rstd[2], data[2], sc[2], cdata[2], csc[2], amax[2], scale[2];
  for (int d = 0; d < 2; d++) {
    y[d].assign((size_t)(n * sim_esize(dt)), 0xCD);
    mean[d].assign((size_t)s.rows * 4, 0xCD);
    rstd[d].assign((size_t)s.rows * 4, 0xCD);
    data[d].assign((size_t)n, 0xCD);
    cdata[d].assign((size_t)n, 0xCD);
    sc[d].assign(sc_bytes, 0xCD);
    csc[d].assign(csc_bytes, 0xCD);
    const float am = 0.25f, sv = current ? -1.0f : 37.5f;
    amax[d].assign(4, 0);
    memcpy(amax[d].data(), &am, 4);
    scale[d].assign(4, 0);
    memcpy(scale[d].data(), &sv, 4);
  }
  for (int d = 0; d < 2; d++) {
    uint32_t work[2] = {0, 0};
    lutra_norm_quant_args a;
    memset(&a, 0, sizeof a);
    lutra_norm_args &na = a.norm;
    na = norm_args(x, g, b, dt, pdt, s, rms, zc);
    na.y = want_y ? y[d].data() : nullptr;
    na.mean = stats ? reinterpret_cast<float *>(mean[d].data()) : nullptr;
    na.rstd = stats ? reinterpret_cast<float *>(rstd[d].data()) : nullptr;
    lutra_quant_args &q = a.quant;
    q.out_dtype = od;
    q.data = row ? data[d].data() : nullptr;
    q.scale_inv = row ? sc[d].data() : nullptr;
    q.col_data = col ? cdata[d].data() : nullptr;
    q.col_scale_inv = col ? csc[d].data() : nullptr;
    q.scale = reinterpret_cast<float *>(scale[d].data());
    q.amax = scaling == LUTRA_SCALING_TENSOR ? reinterpret_cast<float *>(amax[d].data()) : nullptr;
    q.power_2_scale = scaling == LUTRA_SCALING_BLOCK_1D ? (int)(seed & 1) : 0;
    q.amax_epsilon = 0.0f;
    a.scaling = scaling;
    a.current = current;
    a.fp8_max = od == LUTRA_E4M3 ? 448.0f : 57344.0f;
    a.work = work;
    const int rc = d == 0 ? cpu::lutra_cpu_norm_quantize(&a) : (int)lk_norm_quantize(&a, 0);
    if (rc != 0) {
      printf("FAIL %s: rc %d (device %d)\n", what, rc, d);
      failures++;
      return;
    }
  }
  if (want_y && !same(what, "y", y[0], y[1])) return;
  if (stats &&
      (!same(what, "rstd", rstd[0], rstd[1]) || (!rms && !same(what, "mean", mean[0], mean[1]))))
    return;
  if (row && (!same(what, "codes", data[0], data[1]) || !same(what, "scales", sc[0], sc[1])))
    return;
  if (col &&
      (!same(what, "col codes", cdata[0], cdata[1]) || !same(what, "col scales", csc[0], csc[1])))
    return;
  if (scaling == LUTRA_SCALING_TENSOR)
    if (!same(what, "amax", amax[0], amax[1]) || !same(what, "scale", scale[0], scale[1])) return;
}

int main(int argc, char **argv) {
  /* ARGS: quick (fewer cases), then optionally norm, narrow (the norms of at most 1024 columns:
   * the narrow backward's, minutes on two cores), fused, tensor, current or tiles (only those) */
  const bool quick = argc > 1 && !strcmp(argv[1], "quick");
  const char *only = argc > 2 ? argv[2] : "";
  setvbuf(stdout, nullptr, _IOLBF, 0); /* progress shows while it runs */
  /* the vector path (16-byte rows), the scalar one (hidden not a whole number of vectors), one
   * to eight chunks per thread (row-resident, 8192 bf16 columns the widest), wider rows (the
   * fallback kernels), one row, and enough rows for several backward row blocks with several
   * f32 groups each; rows that fill the threads' chunks (the kernels' FULL: 16-bit 2048 and
   * 4096, f32 1024) over several pairs a block and an odd last row; the narrow backward's one to
   * four chunks a lane (64, 264, 520 or 768, 1024 bf16 columns) */
  const Shape norm_shapes[] = {{3, 64},   {7, 77},   {70, 520},  {33, 2056}, {5, 4100},  {1, 4096},
                               {1, 9},    {700, 64}, {130, 264}, {17, 8192}, {3, 8200},  {2, 12288},
                               {9, 1030}, {4, 2500}, {37, 2048}, {11, 4096}, {27, 1024}, {50, 768}};
  uint32_t seed = 1;
  for (int dt : {LUTRA_BF16, LUTRA_F16, LUTRA_F32})
    for (int pdt : {LUTRA_F32, LUTRA_BF16})
      for (const Shape &s : norm_shapes) {
        if (!strcmp(only, "fused") || !strcmp(only, "current")) continue;
        if (!strcmp(only, "narrow") && (s.hidden > 1024 || s.rows * s.hidden > 40000)) continue;
        if (quick && (s.hidden > 2100 || pdt == LUTRA_BF16) && dt != LUTRA_BF16) continue;
        for (int rms = 0; rms < 2; rms++) {
          const bool zc = (seed & 3) == 0;
          run_norm(dt, pdt, s, rms, zc, seed++);
        }
      }
  /* per-tensor: the row-resident kernel (whole 16-row column runs when rows is a multiple of
   * 16, byte runs otherwise; the scalar path at hidden 1030; rows that fill every thread's
   * chunks, the kernels' FULL, at 2048, 4096 and 8192), and above 8192 columns the tiles;
   * narrow rows (768, 1536: four and eight chunks a lane of the statistics' warps) take the
   * tiles too */
  const Shape fused_shapes[] = {{32, 64},   {64, 96},   {96, 320},   {160, 136}, {37, 72},
                                {131, 40},  {45, 50},   {1, 64},     {32, 4096}, {17, 2048},
                                {16, 8192}, {33, 1030}, {16, 12288}, {48, 768},  {32, 1536}};
  for (int dt : {LUTRA_BF16, LUTRA_F32})
    for (int od : {LUTRA_E4M3, LUTRA_E5M2})
      for (const Shape &s : fused_shapes) {
        if (!strcmp(only, "norm") || !strcmp(only, "narrow")) continue;
        /* tensor: per-tensor scaling only; current: its current scaling only; tiles: MXFP8 and
         * 1x128 only */
        const bool current_only = !strcmp(only, "current");
        const bool tensor = strcmp(only, "tiles") != 0,
                   tiles = strcmp(only, "tensor") != 0 && !current_only;
        if (quick && (od == LUTRA_E5M2 || dt == LUTRA_F32) && s.rows * s.hidden > 7000) continue;
        const int pdt = (seed & 1) ? LUTRA_F32 : LUTRA_BF16;
        for (int rms = 0; rms < 2; rms++) {
          if (tensor) {
            if (!current_only) {
              run_fused(dt, pdt, od, s, rms, LUTRA_SCALING_TENSOR, false, true, true, true, seed++);
              run_fused(dt, pdt, od, s, rms, LUTRA_SCALING_TENSOR, false, true, false, false,
                        seed++);
            }
            /* current: both copies, with y in every other case */
            const bool cur_y = seed & 1;
            run_fused(dt, pdt, od, s, rms, LUTRA_SCALING_TENSOR, true, true, true, cur_y, seed++);
          }
          if (!tiles) continue;
          if (s.hidden % 32 == 0 && s.rows % 32 == 0)
            run_fused(dt, pdt, od, s, rms, LUTRA_SCALING_MXFP8, false, true, true, false, seed++);
          if (s.hidden % 32 == 0)
            run_fused(dt, pdt, od, s, rms, LUTRA_SCALING_MXFP8, false, true, false, true, seed++);
          run_fused(dt, pdt, od, s, rms, LUTRA_SCALING_BLOCK_1D, false, true, true, false, seed++);
          run_fused(dt, pdt, od, s, rms, LUTRA_SCALING_BLOCK_1D, false, false, true, true, seed++);
        }
      }
  printf("%d passed, %d failed\n", checks - failures, failures);
  return failures != 0;
}

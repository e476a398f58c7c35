/* Runs GroupedLinear's split-quantization kernels (kernels/grouped/grouped_quantize.cu) on the CPU,
 * one std::thread per CUDA thread, and compares every output byte (codes, scale inverses, scales,
 * amaxes, bias gradients) with the CPU backend's reference (lutra_cpu_grouped_quantize), for
 * token splits with empty experts and sizes that are no multiple of 16, for the weights (one
 * pointer per expert), under delayed and current scaling, E4M3 and E5M2, f32 and bf16 inputs,
 * with an activation inside the cast (forward: its output quantized; backward: its input
 * gradient, with the bias gradient; gated kinds; the matrix also written to act_out);
 * and that a bad split sets the flag and writes nothing. For the kernels' indexing, barriers
 * and atomics on a machine without a GPU; FP8 conversions take common/codec.cuh's integer path
 * here.
 *
 *   make CUDA=0 && make sim-grouped */
#include "sim_harness.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#define LKC_LAUNCH SIM_LAUNCH

#include "grouped/grouped_dequant.cu"
#include "grouped/grouped_quantize.cu"
#include "grouped/grouped_quantize_blocks.cu"

/* ---- the check ------------------------------------------------------------------------------ */

#include "sim_cpu.h"

static int failures = 0;

static void same(const void *got, const void *want, size_t bytes, const char *what,
                 const char *name) {
  if (memcmp(got, want, bytes) == 0) return;
  const unsigned char *g = (const unsigned char *)got, *w = (const unsigned char *)want;
  size_t i = 0;
  while (g[i] == w[i])
    i++;
  printf("FAIL %s: %s differs at byte %zu of %zu (%02x vs %02x)\n", name, what, i, bytes, g[i],
         w[i]);
  failures++;
}

struct Side { /* the buffers of one run */
  std::vector<unsigned char> data, col, sinv, csinv, state, act_out;
  std::vector<std::vector<float>> dbias;
  std::vector<void *> dbias_ptr;
  int32_t bad = 0;
};

struct Case {
  const char *name;
  int kind, x_dtype, out_dtype, num, cols;
  std::vector<int32_t> splits; /* empty: the weights, rows_each rows each */
  int rows_each;
  bool dbias, accumulate, bad;
  int x_shift = 0; /* elements the token matrix starts past an aligned address (unaligned loads) */
  /* an activation inside the cast (LUTRA_ACT_*, 0: none), its direction, and act_out */
  int act = 0, act_forward = 0;
  bool act_out = false;
};

static void fill_random(unsigned char *buf, int64_t n, int dtype, std::mt19937_64 &rng) {
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (int64_t i = 0; i < n; i++) {
    float v = nd(rng);
    if (dtype == LUTRA_F32)
      memcpy(&buf[(size_t)i * 4], &v, 4);
    else {
      uint16_t h = (uint16_t)lkc::bf16_bits(v);
      memcpy(&buf[(size_t)i * 2], &h, 2);
    }
  }
}

static bool two_launches = false; /* current scaling without the one-launch kernel's tickets */

static void run_case(const Case &c, uint64_t seed) {
  const int num = c.num, align = 16;
  const bool weights = c.splits.empty();
  int64_t total = 0;
  for (int32_t s : c.splits)
    total += s;
  if (weights) total = (int64_t)num * c.rows_each;
  if (c.bad) total += 3; /* the splits do not sum to the rows */
  const int64_t cols = c.cols, cap = weights ? num * lutra_grouped_roundup(c.rows_each, align)
                                             : lutra_grouped_rows_cap(total, num, align);
  const size_t es = c.x_dtype == LUTRA_F32 ? 4 : 2;
  std::mt19937_64 rng(seed);
  /* x: the rows, or an activation's output gradient (gated: half the columns); act: its input
   * (a gated forward's: twice the columns) */
  const bool gated = lutra_act_is_gated(c.act);
  const int64_t x_cols = c.act && !c.act_forward && gated ? cols / 2 : cols;
  const int64_t act_cols = c.act && c.act_forward && gated ? 2 * cols : cols;
  std::vector<unsigned char> xbuf((size_t)(total * x_cols + c.x_shift) * es + 16), act;
  unsigned char *x = xbuf.data() + (16 - (uintptr_t)xbuf.data() % 16) % 16 + c.x_shift * es;
  fill_random(x, total * x_cols, c.x_dtype, rng);
  if (c.act) {
    act.assign((size_t)(total * act_cols) * es, 0);
    fill_random(act.data(), total * act_cols, c.x_dtype, rng);
  }
  std::vector<const void *> xs;
  for (int e = 0; weights && e < num; e++)
    xs.push_back(&x[(size_t)((int64_t)e * c.rows_each * cols) * es]);
  const int64_t hist = c.kind == LUTRA_QUANT_DELAYED ? 4 : 0;
  const size_t sb =
      (size_t)lutra_grouped_scale_cap(LUTRA_SCALING_TENSOR, total, num, align, cols, false) * 4;
  Side side[2];
  for (Side &s : side) {
    s.data.assign((size_t)(cap * cols), 0xEE);
    s.col.assign((size_t)(cap * cols), 0xEE);
    s.sinv.assign(sb, 0);
    s.csinv.assign(sb, 0);
    /* + the one-launch kernel's two tickets (current scaling), checked zero after as the rest */
    s.state.assign((size_t)(12 * num + num * hist + 2) * 4, 0);
    float *st = (float *)s.state.data();
    for (int e = 0; e < num; e++) {
      st[4 * e] = 1.0f + 0.25f * (float)e;      /* delayed scales, one per expert */
      if (hist) st[12 * num + e * hist] = 0.5f; /* an amax recorded before */
    }
    s.dbias.assign(num, std::vector<float>(cols, 0.125f));
    s.act_out.assign((size_t)(total * cols) * es, 0xEE);
    for (int e = 0; e < num; e++)
      s.dbias_ptr.push_back(s.dbias[e].data());
  }
  for (int k = 0; k < 2; k++) {
    Side &s = side[k];
    float *st = (float *)s.state.data();
    lutra_grouped_quant_args a{};
    a.num = num;
    a.kind = c.kind;
    a.splits = weights ? nullptr : c.splits.data();
    a.bad_split = &s.bad;
    a.total_rows = total;
    a.cols = cols;
    a.x = x;
    a.xs = weights ? xs.data() : nullptr;
    a.rows_each = c.rows_each;
    a.x_dtype = c.x_dtype;
    a.fp8_max = lutra_dtype_max(c.out_dtype);
    a.amax_stride = c.kind == LUTRA_QUANT_DELAYED ? (int)hist : 4;
    a.scale = st;
    a.amax = c.kind == LUTRA_QUANT_DELAYED ? st + 12 * num : st + 8 * num;
    a.work = (uint32_t *)(st + 8 * num + 1);
    if (c.kind == LUTRA_QUANT_CURRENT && !two_launches)
      a.tickets = (uint32_t *)(st + 12 * num + num * hist);
    a.out = lutra_grouped_fp8{s.data.data(), s.sinv.data(),        s.col.data(), s.csinv.data(),
                              c.out_dtype,   LUTRA_SCALING_TENSOR, align,        0};
    a.dbias = c.dbias ? s.dbias_ptr.data() : nullptr;
    a.dbias_dtype = LUTRA_F32;
    a.dbias_accumulate = c.accumulate;
    if (c.act) {
      a.act = act.data();
      a.act_kind = c.act;
      a.act_forward = c.act_forward;
      a.act_out = c.act_out ? s.act_out.data() : nullptr;
      if (c.act_forward) a.x = nullptr;
    }
    if (k == 0) {
      if (lk_grouped_quantize(&a, cap, nullptr) != cudaSuccess) {
        printf("FAIL %s: the launcher refused\n", c.name);
        failures++;
        return;
      }
    } else if (c.bad) {
      s.bad = 1; /* the CPU refuses at once; the device writes nothing */
    } else if (cpu::lutra_cpu_grouped_quantize(&a) != LUTRA_OK) {
      printf("FAIL %s: the CPU reference refused\n", c.name);
      failures++;
      return;
    }
  }
  if (getenv("SIM_DEBUG")) {
    const float *g0 = (const float *)side[0].state.data(),
                *g1 = (const float *)side[1].state.data();
    for (int e = 0; e < num; e++)
      printf("  e%d scale %g/%g amax %g/%g work %08x/%08x\n", e, g0[4 * e], g1[4 * e],
             g0[8 * num + 4 * e], g1[8 * num + 4 * e], ((const uint32_t *)g0)[8 * num + 4 * e + 1],
             ((const uint32_t *)g1)[8 * num + 4 * e + 1]);
  }
  same(&side[0].bad, &side[1].bad, 4, "bad_split flag", c.name);
  same(side[0].data.data(), side[1].data.data(), side[0].data.size(), "rowwise codes", c.name);
  same(side[0].col.data(), side[1].col.data(), side[0].col.size(), "columnwise codes", c.name);
  same(side[0].sinv.data(), side[1].sinv.data(), sb, "scale_inv", c.name);
  same(side[0].csinv.data(), side[1].csinv.data(), sb, "col_scale_inv", c.name);
  /* the whole state: scales, amaxes, histories, and current scaling's work words, which the
   * kernels leave zero as they found them */
  same(side[0].state.data(), side[1].state.data(), side[0].state.size(), "scaling state", c.name);
  for (int e = 0; e < num; e++)
    same(side[0].dbias[e].data(), side[1].dbias[e].data(), (size_t)cols * 4, "dbias", c.name);
  same(side[0].act_out.data(), side[1].act_out.data(), side[0].act_out.size(), "act_out", c.name);
  printf("%s %s\n", failures ? "..." : "ok  ", c.name);
}

/* ---- the block-scaled recipes (kernels/grouped/grouped_quantize_blocks.cu) and the dequantization
 * for the GEMM (kernels/grouped/grouped_dequant.cu)
 * ---------------------------------------------------- */

struct BlockCase {
  const char *name;
  int kind, x_dtype, out_dtype, num, cols, align;
  std::vector<int32_t> splits; /* empty: the weights, rows_each rows each */
  int rows_each;
  bool dbias, p2;
};

static int scaling_of(int kind) {
  return kind == LUTRA_QUANT_MXFP8      ? LUTRA_SCALING_MXFP8
         : kind == LUTRA_QUANT_BLOCK_1D ? LUTRA_SCALING_BLOCK_1D
                                        : LUTRA_SCALING_BLOCK_2D;
}

/* each expert's slice of a packed copy dequantized by the CPU to f32, rounded to bf16, in the
 * high-precision orientation, against lk_grouped_dequantize */
static void check_dequant(const lutra_grouped_fp8 &q, bool col, const std::vector<int32_t> &rows,
                          int64_t cols, int64_t cap, const int32_t *splits, int64_t rows_each,
                          int64_t total, const char *name) {
  const int num = (int)rows.size();
  std::vector<uint16_t> got((size_t)(cap * cols), 0xDEAD), want((size_t)(cap * cols), 0xDEAD);
  if (lk_grouped_dequantize(&q, col, splits, rows_each, num, total, cols, cap, got.data(),
                            nullptr) != cudaSuccess) {
    printf("FAIL %s: the dequantize launcher refused\n", name);
    failures++;
    return;
  }
  const int ss = q.scaling == LUTRA_SCALING_MXFP8 ? 1 : 4;
  int64_t P = 0, sc = 0;
  for (int e = 0; e < num; e++) {
    const int64_t p = lutra_grouped_roundup(rows[e], q.align);
    std::vector<float> f((size_t)(p * cols));
    if (p > 0)
      cpu::lutra_cpu_dequantize(&(const lutra_dequant_args &)lutra_dequant_args{
          (const char *)(col ? q.col_data : q.data) + P * cols,
          (const char *)(col ? q.col_scale_inv : q.scale_inv) + sc * ss, q.dtype, q.scaling,
          col ? cols : p, col ? p : cols, f.data(), LUTRA_F32, 0});
    for (int64_t r = 0; r < p; r++)
      for (int64_t c = 0; c < cols; c++)
        want[(size_t)((P + r) * cols + c)] =
            (uint16_t)lkc::bf16_bits(col ? f[(size_t)(c * p + r)] : f[(size_t)(r * cols + c)]);
    P += p;
    sc += lutra_grouped_scale_region(q.scaling, p, cols, col);
  }
  same(got.data(), want.data(), got.size() * 2,
       col ? "dequantized columnwise copy" : "dequantized rowwise copy", name);
}

static void run_block_case(const BlockCase &c, uint64_t seed) {
  const int num = c.num, align = c.align, scaling = scaling_of(c.kind);
  const bool weights = c.splits.empty();
  std::vector<int32_t> rows = weights ? std::vector<int32_t>(num, c.rows_each) : c.splits;
  int64_t total = 0;
  for (int32_t r : rows)
    total += r;
  const int64_t cols = c.cols, cap = weights
                                         ? (int64_t)num * lutra_grouped_roundup(c.rows_each, align)
                                         : lutra_grouped_rows_cap(total, num, align);
  const size_t es = c.x_dtype == LUTRA_F32 ? 4 : 2, ss = scaling == LUTRA_SCALING_MXFP8 ? 1 : 4;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<unsigned char> x((size_t)(total * cols) * es);
  for (int64_t i = 0; i < total * cols; i++) {
    float v = nd(rng) * (i % 97 == 0 ? 50.0f : 1.0f); /* outliers, so blocks differ */
    if (c.x_dtype == LUTRA_F32)
      memcpy(&x[(size_t)i * 4], &v, 4);
    else {
      uint16_t h = (uint16_t)lkc::bf16_bits(v);
      memcpy(&x[(size_t)i * 2], &h, 2);
    }
  }
  std::vector<const void *> xs;
  for (int e = 0; weights && e < num; e++)
    xs.push_back(&x[(size_t)((int64_t)e * c.rows_each * cols) * es]);
  const size_t sb = ss * (size_t)lutra_grouped_scale_cap(scaling, total, num, align, cols, false);
  const size_t cb = ss * (size_t)lutra_grouped_scale_cap(scaling, total, num, align, cols, true);
  Side side[2];
  for (Side &s : side) {
    s.data.assign((size_t)(cap * cols) + 16, 0xEE);
    s.col.assign((size_t)(cap * cols) + 16, 0xEE);
    s.sinv.assign(sb, 0);
    s.csinv.assign(cb, 0);
    s.dbias.assign(num, std::vector<float>(cols, 0.125f));
    for (int e = 0; e < num; e++)
      s.dbias_ptr.push_back(s.dbias[e].data());
  }
  for (int k = 0; k < 2; k++) {
    Side &s = side[k];
    lutra_grouped_quant_args a{};
    a.num = num;
    a.kind = c.kind;
    a.splits = weights ? nullptr : rows.data();
    a.bad_split = &s.bad;
    a.total_rows = total;
    a.cols = cols;
    a.x = x.data();
    a.xs = weights ? xs.data() : nullptr;
    a.rows_each = c.rows_each;
    a.x_dtype = c.x_dtype;
    a.power_2_scale = c.p2;
    a.fp8_max = lutra_dtype_max(c.out_dtype);
    a.block_dim = c.kind == LUTRA_QUANT_BLOCK_2D ? 2 : 1;
    a.out = lutra_grouped_fp8{s.data.data(), s.sinv.data(), s.col.data(), s.csinv.data(),
                              c.out_dtype,   scaling,       align,        0};
    a.dbias = c.dbias ? s.dbias_ptr.data() : nullptr;
    a.dbias_dtype = LUTRA_F32;
    int st = k == 0 ? (lk_grouped_quantize_blocks(&a, cap, nullptr) == cudaSuccess ? 0 : 1)
                    : cpu::lutra_cpu_grouped_quantize(&a);
    if (st != 0) {
      printf("FAIL %s: the %s refused\n", c.name, k == 0 ? "launcher" : "CPU reference");
      failures++;
      return;
    }
  }
  same(&side[0].bad, &side[1].bad, 4, "bad_split flag", c.name);
  same(side[0].data.data(), side[1].data.data(), side[0].data.size(), "rowwise codes", c.name);
  same(side[0].col.data(), side[1].col.data(), side[0].col.size(), "columnwise codes", c.name);
  same(side[0].sinv.data(), side[1].sinv.data(), sb, "scale_inv", c.name);
  same(side[0].csinv.data(), side[1].csinv.data(), cb, "col_scale_inv", c.name);
  for (int e = 0; e < num; e++)
    same(side[0].dbias[e].data(), side[1].dbias[e].data(), (size_t)cols * 4, "dbias", c.name);
  const lutra_grouped_fp8 q{side[0].data.data(),
                            side[0].sinv.data(),
                            side[0].col.data(),
                            side[0].csinv.data(),
                            c.out_dtype,
                            scaling,
                            align,
                            0};
  for (int col = 0; col < 2; col++)
    check_dequant(q, col, rows, cols, cap, weights ? nullptr : rows.data(), c.rows_each, total,
                  c.name);
  printf("%s %s\n", failures ? "..." : "ok  ", c.name);
}

int main() {
  const std::vector<int32_t> splits = {7, 0, 33, 16, 0, 1, 20};
  std::vector<Case> cases = {
      {"delayed e4m3 bf16 tokens", LUTRA_QUANT_DELAYED, LUTRA_BF16, LUTRA_E4M3, 7, 48, splits, 0,
       false, false, false},
      {"delayed e5m2 f32 tokens + dbias", LUTRA_QUANT_DELAYED, LUTRA_F32, LUTRA_E5M2, 7, 32, splits,
       0, true, false, false},
      {"current e4m3 bf16 tokens", LUTRA_QUANT_CURRENT, LUTRA_BF16, LUTRA_E4M3, 7, 64, splits, 0,
       false, false, false},
      /* past one 128-column chunk (the loads run a chunk ahead) and past four (the amax pass
       * loads four at once), neither a multiple of 128 */
      {"current e4m3 bf16 tokens, 656 columns", LUTRA_QUANT_CURRENT, LUTRA_BF16, LUTRA_E4M3, 7, 656,
       splits, 0, false, false, false},
      {"delayed e5m2 f32 weights, 272 columns",
       LUTRA_QUANT_DELAYED,
       LUTRA_F32,
       LUTRA_E5M2,
       3,
       272,
       {},
       32,
       false,
       false,
       false},
      {"current e5m2 bf16 tokens + dbias accumulated", LUTRA_QUANT_CURRENT, LUTRA_BF16, LUTRA_E5M2,
       7, 16, splits, 0, true, true, false},
      {"delayed e4m3 bf16 weights",
       LUTRA_QUANT_DELAYED,
       LUTRA_BF16,
       LUTRA_E4M3,
       3,
       32,
       {},
       48,
       false,
       false,
       false},
      {"current e4m3 f32 weights",
       LUTRA_QUANT_CURRENT,
       LUTRA_F32,
       LUTRA_E4M3,
       4,
       16,
       {},
       32,
       false,
       false,
       false},
      /* weights of 40 rows: each padded to 48, the expert found by arithmetic (no splits) */
      {"current e4m3 bf16 weights, 40 rows each",
       LUTRA_QUANT_CURRENT,
       LUTRA_BF16,
       LUTRA_E4M3,
       5,
       144,
       {},
       40,
       false,
       false,
       false},
      /* weights of 64 and 128 rows: 64-row cast tiles (two or more per expert in the one
       * launch's ticket count), with a partial chunk of columns */
      {"delayed e4m3 bf16 weights, 64 rows each (64-row tiles)",
       LUTRA_QUANT_DELAYED,
       LUTRA_BF16,
       LUTRA_E4M3,
       3,
       272,
       {},
       64,
       false,
       false,
       false},
      {"current e5m2 bf16 weights, 128 rows each (64-row tiles)",
       LUTRA_QUANT_CURRENT,
       LUTRA_BF16,
       LUTRA_E5M2,
       3,
       144,
       {},
       128,
       false,
       false,
       false},
      {"current e4m3 f32 weights, 64 rows each (64-row tiles)",
       LUTRA_QUANT_CURRENT,
       LUTRA_F32,
       LUTRA_E4M3,
       4,
       256,
       {},
       64,
       false,
       false,
       false},
      {"current e4m3 bf16 tokens, 272 columns (chunks of 128 and a partial one)",
       LUTRA_QUANT_CURRENT, LUTRA_BF16, LUTRA_E4M3, 7, 272, splits, 0, false, false, false},
      {"delayed e4m3 bf16 tokens, unaligned rows", LUTRA_QUANT_DELAYED, LUTRA_BF16, LUTRA_E4M3, 7,
       144, splits, 0, false, false, false, 1},
      {"current e5m2 f32 tokens, 40 columns (no multiple of 16)", LUTRA_QUANT_CURRENT, LUTRA_F32,
       LUTRA_E5M2, 7, 40, splits, 0, true, false, false},
      {"current e4m3 bf16 weights, 160 columns",
       LUTRA_QUANT_CURRENT,
       LUTRA_BF16,
       LUTRA_E4M3,
       3,
       160,
       {},
       32,
       false,
       false,
       false},
      {"bad splits: flag set, nothing written", LUTRA_QUANT_CURRENT, LUTRA_BF16, LUTRA_E4M3, 7, 16,
       splits, 0, true, false, true},
  };
  /* an activation inside the cast: forward (its output, written to act_out too) and backward
   * (its input gradient with the bias gradient), every kind, both scalings */
  static const struct {
    const char *name;
    int act;
  } acts[] = {{"gelu_tanh", LUTRA_ACT_GELU_TANH}, {"relu", LUTRA_ACT_RELU},
              {"silu", LUTRA_ACT_SILU},           {"qgelu", LUTRA_ACT_QGELU},
              {"srelu", LUTRA_ACT_SRELU},         {"gelu_erf", LUTRA_ACT_GELU_ERF},
              {"swiglu", LUTRA_ACT_SWIGLU},       {"geglu", LUTRA_ACT_GEGLU},
              {"reglu", LUTRA_ACT_REGLU},         {"tanh", LUTRA_ACT_TANH}};
  static std::vector<std::string> names;
  names.reserve(4 * sizeof acts / sizeof *acts);
  for (const auto &k : acts)
    for (int fwd = 0; fwd < 2; fwd++)
      for (int cur = 0; cur < 2; cur++) {
        names.push_back(std::string(cur ? "current " : "delayed ") + k.name +
                        (fwd ? " forward + act_out" : " backward + dbias"));
        Case c = {names.back().c_str(),
                  cur ? LUTRA_QUANT_CURRENT : LUTRA_QUANT_DELAYED,
                  LUTRA_BF16,
                  fwd ? LUTRA_E4M3 : LUTRA_E5M2,
                  7,
                  32,
                  splits,
                  0,
                  !fwd,
                  false,
                  false};
        c.act = k.act;
        c.act_forward = fwd;
        c.act_out = fwd;
        cases.push_back(c);
      }
  uint64_t seed = 1;
  for (const Case &c : cases)
    run_case(c, seed++);
  /* current scaling as two launches (no tickets: k_amax, then k_cast), as a caller without the
   * ticket words gets it */
  two_launches = true;
  for (const Case &c : cases)
    if (c.kind == LUTRA_QUANT_CURRENT && !c.act) {
      const std::string name = std::string(c.name) + ", two launches";
      Case two = c;
      two.name = name.c_str();
      run_case(two, seed++);
    }
  two_launches = false;
  const std::vector<int32_t> mx_splits = {7, 0, 40, 1, 33};
  const std::vector<BlockCase> block_cases = {
      {"mxfp8 e4m3 bf16 tokens + dbias", LUTRA_QUANT_MXFP8, LUTRA_BF16, LUTRA_E4M3, 5, 160, 32,
       mx_splits, 0, true, false},
      {"mxfp8 e5m2 f32 tokens", LUTRA_QUANT_MXFP8, LUTRA_F32, LUTRA_E5M2, 5, 64, 32, mx_splits, 0,
       false, false},
      {"mxfp8 e4m3 bf16 weights",
       LUTRA_QUANT_MXFP8,
       LUTRA_BF16,
       LUTRA_E4M3,
       3,
       96,
       32,
       {},
       64,
       false,
       false},
      {"1x128 e4m3 bf16 tokens (pow-2 scales) + dbias",
       LUTRA_QUANT_BLOCK_1D,
       LUTRA_BF16,
       LUTRA_E4M3,
       4,
       144,
       128,
       {5, 0, 130, 1},
       0,
       true,
       true},
      {"1x128 e5m2 f32 tokens",
       LUTRA_QUANT_BLOCK_1D,
       LUTRA_F32,
       LUTRA_E5M2,
       3,
       48,
       128,
       {3, 200, 0},
       0,
       false,
       false},
      {"128x128 e4m3 bf16 weights, 16-row padding (a short last group)",
       LUTRA_QUANT_BLOCK_2D,
       LUTRA_BF16,
       LUTRA_E4M3,
       3,
       272,
       16,
       {},
       144,
       false,
       true},
      {"128x128 e4m3 f32 tokens",
       LUTRA_QUANT_BLOCK_2D,
       LUTRA_F32,
       LUTRA_E4M3,
       3,
       160,
       128,
       {129, 0, 7},
       0,
       false,
       false},
  };
  for (const BlockCase &c : block_cases)
    run_block_case(c, seed++);
  printf("%d failure%s\n", failures, failures == 1 ? "" : "s");
  return failures ? 1 : 0;
}

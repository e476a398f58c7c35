/* Runs GroupedLinear's split-quantization kernels (kernels/grouped_quantize.cu) on the CPU, one
 * std::thread per CUDA thread, and compares every output byte (codes, scale inverses, scales,
 * amaxes, bias gradients) with the CPU backend's reference (lutra_cpu_grouped_quantize), for
 * token splits with empty experts and sizes that are no multiple of 16, for the weights (one
 * pointer per expert), under delayed and current scaling, E4M3 and E5M2, f32 and bf16 inputs,
 * with an activation inside the cast (forward: its output quantized; backward: its input
 * gradient, with the bias gradient; gated kinds; the matrix also written to act_out); and that
 * a bad split sets the flag and writes nothing. For the kernels' indexing, barriers
 * and atomics on a machine without a GPU; FP8 conversions take common.cuh's integer path here.
 *
 *   make CUDA=0 && make sim-grouped */
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

/* ---- the CUDA device model (as tools/sim_quantize_mx.cpp, with 2-D grids) ------------------- */

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
  std::barrier<> *block_bar;
  std::vector<std::barrier<> *> warp_bar;
  std::vector<uint64_t> slots;
};

static thread_local uint3 sim_tid, sim_bid;
static thread_local SimBlock *sim_blk;
static dim3 sim_grid, sim_block;
#define threadIdx sim_tid
#define blockIdx  sim_bid
#define gridDim   sim_grid
#define blockDim  sim_block

static void __syncthreads() {
  sim_blk->block_bar->arrive_and_wait();
}

template <typename T> static T __shfl_xor_sync(unsigned, T v, int m) {
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
static unsigned atomicAdd(unsigned *p, unsigned v) {
  std::lock_guard<std::mutex> g(sim_atomic);
  const unsigned o = *p;
  *p = o + v;
  return o;
}
static void __threadfence() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
}
static float __uint_as_float(unsigned u) { /* ops_common.cuh's bf16 unpacking (act_cast.cuh) */
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* The grid runs block after block; a block's threads run concurrently. */
template <typename K, typename... A>
static void sim_launch(K kernel, dim3 grid, unsigned block, cudaStream_t, A... args) {
  sim_grid = grid;
  sim_block = dim3(block);
  for (unsigned by = 0; by < grid.y; by++)
    for (unsigned bx = 0; bx < grid.x; bx++) {
      SimBlock blk;
      std::barrier<> bar((std::ptrdiff_t)block);
      blk.block_bar = &bar;
      std::vector<std::unique_ptr<std::barrier<>>> wb;
      for (unsigned w = 0; w < (block + 31) / 32; w++) {
        wb.emplace_back(new std::barrier<>(block - 32 * w < 32 ? block - 32 * w : 32));
        blk.warp_bar.push_back(wb.back().get());
      }
      blk.slots.assign(block, 0);
      std::vector<std::thread> th;
      for (unsigned t = 0; t < block; t++)
        th.emplace_back([&, t] {
          sim_tid = make_uint3(t, 0, 0);
          sim_bid = make_uint3(bx, by, 0);
          sim_blk = &blk;
          kernel(args...);
        });
      for (auto &x : th)
        x.join();
    }
}
#define LKC_LAUNCH(kernel, grid, block, smem, stream, ...)                                         \
  sim_launch(kernel, dim3(grid), (block), (stream), __VA_ARGS__)
#define LKC_SIM 1

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
}

#include "grouped_quantize.cu"

/* ---- the check ------------------------------------------------------------------------------ */

extern "C" int lutra_cpu_grouped_quantize(const lutra_grouped_quant_args *a);

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
  /* an activation inside the cast (LUTRA_ACT_*, 0: none), its direction, and act_out */
  int act = 0, act_forward = 0;
  bool act_out = false;
};

static void fill_random(std::vector<unsigned char> &buf, int64_t n, int dtype, std::mt19937_64 &rng) {
  std::normal_distribution<float> nd(0.0f, 2.0f);
  const size_t es = dtype == LUTRA_F32 ? 4 : 2;
  buf.assign((size_t)n * es, 0);
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

static void run_case(const Case &c, uint64_t seed) {
  const int num = c.num, align = 16;
  const bool weights = c.splits.empty();
  int64_t total = 0;
  for (int32_t s : c.splits)
    total += s;
  if (weights) total = (int64_t)num * c.rows_each;
  if (c.bad) total += 3; /* the splits do not sum to the rows */
  const int64_t cols = c.cols, cap = weights ? total : lutra_grouped_rows_cap(total, num, align);
  const size_t es = c.x_dtype == LUTRA_F32 ? 4 : 2;
  std::mt19937_64 rng(seed);
  /* x: the rows, or an activation's output gradient (gated: half the columns); act: its input
   * (a gated forward's: twice the columns) */
  const bool gated = lutra_act_is_gated(c.act);
  const int64_t x_cols = c.act && !c.act_forward && gated ? cols / 2 : cols;
  const int64_t act_cols = c.act && c.act_forward && gated ? 2 * cols : cols;
  std::vector<unsigned char> x, act;
  fill_random(x, total * x_cols, c.x_dtype, rng);
  if (c.act) fill_random(act, total * act_cols, c.x_dtype, rng);
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
    s.state.assign((size_t)(12 * num + num * hist) * 4, 0);
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
    a.x = x.data();
    a.xs = weights ? xs.data() : nullptr;
    a.rows_each = c.rows_each;
    a.x_dtype = c.x_dtype;
    a.fp8_max = lutra_dtype_max(c.out_dtype);
    a.amax_stride = c.kind == LUTRA_QUANT_DELAYED ? (int)hist : 4;
    a.scale = st;
    a.amax = c.kind == LUTRA_QUANT_DELAYED ? st + 12 * num : st + 8 * num;
    a.work = (uint32_t *)(st + 8 * num + 1);
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
    } else if (lutra_cpu_grouped_quantize(&a) != LUTRA_OK) {
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

int main() {
  const std::vector<int32_t> splits = {7, 0, 33, 16, 0, 1, 20};
  std::vector<Case> cases = {
      {"delayed e4m3 bf16 tokens", LUTRA_QUANT_DELAYED, LUTRA_BF16, LUTRA_E4M3, 7, 48, splits, 0,
       false, false, false},
      {"delayed e5m2 f32 tokens + dbias", LUTRA_QUANT_DELAYED, LUTRA_F32, LUTRA_E5M2, 7, 32, splits,
       0, true, false, false},
      {"current e4m3 bf16 tokens", LUTRA_QUANT_CURRENT, LUTRA_BF16, LUTRA_E4M3, 7, 64, splits, 0,
       false, false, false},
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
              {"reglu", LUTRA_ACT_REGLU}};
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
  printf("%d failure%s\n", failures, failures == 1 ? "" : "s");
  return failures ? 1 : 0;
}

/* Runs kernels/quantize/quantize_nvfp4.cu's per-thread work (kernels/quantize/nvfp4_math.cuh) on
 * the CPU in the kernels' order (zero the amax word, the amax pass, one call per block or tile,
 * thread 0's decode scale) and compares every output byte with the CPU backend
 * (lutra_cpu_quantize_nvfp4, lutra_cpu_dequantize), over shapes, input dtypes and every option
 * combination: the kernels' indexing, packing and arithmetic checked without a GPU. The launches'
 * own mechanics (grid strides, the warp shuffles and atomicMax of the amax) are left to the GPU
 * specs.
 *
 *   make CUDA=0 && make sim-nvfp4    (build/sim_nvfp4, run by the target) */
#include "quantize/nvfp4_math.cuh"

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

extern "C" {
#include "backend/cpu/cpu.h"
}

using namespace lknv;

namespace {

int failures = 0;

void compare(const std::vector<uint8_t> &got, const std::vector<uint8_t> &want, const char *what,
             const char *setup) {
  if (got == want) return;
  size_t i = 0;
  while (got[i] == want[i])
    i++;
  std::printf("%s (%s): first difference at byte %zu: kernel 0x%02x, cpu 0x%02x\n", what, setup, i,
              got[i], want[i]);
  failures++;
}

/* what the launches of lk_quantize_nvfp4 compute, one loop per launch */
void run_kernels(Args a) {
  for (int c = 0; c < 2; c++)
    if (a.scales[c])
      reinterpret_cast<float *>(a.scales[c] + tail_offset(lines_of(a, c), len_of(a, c)))[1] = 0;
  auto amax_into = [&](int copy, int into) {
    const int64_t nb = len_of(a, copy) / B, n = lines_of(a, copy) * nb;
    float m = 0.0f, v[B];
    for (int64_t i = 0; i < n; i++) {
      read_block(a, copy, i / nb, i % nb, v);
      m = fmaxf(m, amax16(v));
    }
    for (int c = 0; c < 2; c++)
      if ((into >> c & 1) && a.scales[c]) {
        float *t =
            reinterpret_cast<float *>(a.scales[c] + tail_offset(lines_of(a, c), len_of(a, c)));
        t[1] = fmaxf(t[1], m);
      }
  };
  auto tail = [&](int c) {
    return reinterpret_cast<float *>(a.scales[c] + tail_offset(lines_of(a, c), len_of(a, c)));
  };
  if (a.opts & LUTRA_NVFP4_2D) {
    amax_into(0, 3);
    const float ge = fp4_global_encode(tail(a.scales[0] ? 0 : 1)[1]);
    for (int64_t ti = 0; ti < a.rows / B; ti++)
      for (int64_t tj = 0; tj < a.cols / B; tj++)
        quantize_tile(a, ti, tj, ge);
    for (int c = 0; c < 2; c++)
      if (a.scales[c]) tail(c)[0] = fdiv(1.0f, ge);
    return;
  }
  for (int c = 0; c < 2; c++) {
    if (!a.data[c]) continue;
    amax_into(c, 1 << c);
    const float ge = fp4_global_encode(tail(c)[1]);
    const int64_t nb = len_of(a, c) / B;
    for (int64_t i = 0; i < lines_of(a, c) * nb; i++)
      quantize_block(a, c, i / nb, i % nb, ge);
    tail(c)[0] = fdiv(1.0f, ge);
  }
}

void one_case(int64_t rows, int64_t cols, int dtype, int opts, bool rowwise, bool columnwise,
              std::mt19937 &rng) {
  char setup[128];
  std::snprintf(setup, sizeof setup, "%lldx%lld %s opts %d%s%s", (long long)rows, (long long)cols,
                lutra_dtype_name(dtype), opts, rowwise ? " rowwise" : "",
                columnwise ? " columnwise" : "");
  const int64_t n = rows * cols;
  std::vector<uint8_t> x(n * 4);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t i = 0; i < n; i++) {
    float v = nd(rng) * std::ldexp(1.0f, (int)((i / 16) % 11) - 5);
    if (i % 97 == 5) v = 0.0f;
    lutra_elem_store(x.data(), dtype, i, v);
  }
  const size_t scale_bytes = (size_t)((rows * cols / 16 + 15) / 16 * 16 + 16);
  std::vector<uint8_t> kd(n / 2, 0xAA), kc(n / 2, 0xAA), ks(scale_bytes, 0), kcs(scale_bytes, 0);
  std::vector<uint8_t> cd(n / 2, 0x55), cc(n / 2, 0x55), cs(scale_bytes, 0), ccs(scale_bytes, 0);
  lutra_quant_args q = {};
  q.x = x.data();
  q.x_dtype = dtype;
  q.out_dtype = LUTRA_E2M1;
  q.rows = rows;
  q.cols = cols;
  q.nvfp4 = opts;
  q.rht_signs = LUTRA_NVFP4_TE_SIGNS;
  q.seed = 0x1234567890ABCDEFull;
  /* the same call into the kernels' buffers (through the launcher's args_of), then the CPU's */
  auto into = [&](std::vector<uint8_t> &d, std::vector<uint8_t> &s, std::vector<uint8_t> &c,
                  std::vector<uint8_t> &cs_) {
    q.data = rowwise ? d.data() : nullptr;
    q.scale_inv = rowwise ? s.data() : nullptr;
    q.col_data = columnwise ? c.data() : nullptr;
    q.col_scale_inv = columnwise ? cs_.data() : nullptr;
  };
  into(kd, ks, kc, kcs);
  run_kernels(args_of(q));
  into(cd, cs, cc, ccs);
  if (lutra_cpu_quantize_nvfp4(&q) != LUTRA_OK) {
    std::printf("cpu refused %s: %s\n", setup, lutra_last_error());
    failures++;
    return;
  }
  /* bytes nobody writes keep their poison, which differs between the two runs: compare only
   * what was written */
  if (rowwise) {
    compare(kd, cd, "rowwise codes", setup);
    compare(ks, cs, "rowwise scales", setup);
  }
  if (columnwise) {
    compare(kc, cc, "columnwise codes", setup);
    compare(kcs, ccs, "columnwise scales", setup);
  }
  /* dequantize: the kernel's blocks against lutra_cpu_dequantize, into each float dtype */
  for (int od : {LUTRA_F32, LUTRA_BF16, LUTRA_F16}) {
    if (!rowwise) break;
    std::vector<uint8_t> ko(n * 4, 0), co(n * 4, 0);
    for (int64_t r = 0; r < rows; r++)
      for (int64_t b = 0; b < cols / B; b++)
        dequant_block(cd.data(), cs.data(), rows, cols, r, b, ko.data(), od);
    lutra_dequant_args d = {};
    d.data = cd.data();
    d.scale_inv = cs.data();
    d.dtype = LUTRA_E2M1;
    d.scaling = LUTRA_SCALING_NVFP4;
    d.rows = rows;
    d.cols = cols;
    d.out = co.data();
    d.out_dtype = od;
    lutra_cpu_dequantize(&d);
    compare(ko, co, "dequantize", setup);
  }
}

} // namespace

int main() {
  std::mt19937 rng(7);
  int cases = 0;
  const int64_t shapes[][2] = {{16, 16}, {32, 48}, {64, 16}, {48, 128}, {128, 64}};
  const int opts[] = {0,
                      LUTRA_NVFP4_2D,
                      LUTRA_NVFP4_SR,
                      LUTRA_NVFP4_RHT,
                      LUTRA_NVFP4_SR | LUTRA_NVFP4_RHT,
                      LUTRA_NVFP4_2D | LUTRA_NVFP4_SR};
  for (auto &s : shapes)
    for (int dt : {LUTRA_F32, LUTRA_BF16, LUTRA_F16})
      for (int o : opts)
        for (int parts = 1; parts <= 3; parts++) {
          one_case(s[0], s[1], dt, o, parts & 1, parts & 2, rng);
          cases++;
        }
  std::printf("sim-nvfp4: %d cases, %d mismatches, %s\n", cases, failures,
              failures ? "FAIL" : "ok");
  return failures ? 1 : 0;
}

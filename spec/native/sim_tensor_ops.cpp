/* Runs the tensor operations' kernels (kernels/tensor/tensor_ops.cu: axpby, argmax, softmax, the
 * seeded top-k sampler) on the CPU, one std::thread per CUDA thread, against the CPU backend
 * (src/backend/cpu/tensor_ops_cpu.c): for checking the kernels' indexing, reductions, barriers and
 * the sampler's bisection and chunk walk on a machine without a GPU. axpby and argmax must agree
 * byte for byte; softmax within 2e-6 per probability (the kernel's f32 tree sum against the CPU's
 * f64 sum); the sampler with the same uniform draws, so every row but one whose draw lies within
 * rounding of a boundary: at least 31 of 32 rows, and top_k = 1 the argmax exactly.
 *
 *   make CUDA=0 && make build/sim_tensor_ops && ./build/sim_tensor_ops */
#include "sim_harness.h"

#include <cmath>
#include <cstdio>
#include <random>

#define LKC_LAUNCH SIM_LAUNCH

#include "tensor/tensor_ops.cu"

#include "sim_cpu.h"

namespace cpu {
extern "C" {
LUTRA_TENSOR_OPS_DECLARE(lutra_cpu);
}
} // namespace cpu

static int failures = 0, checks = 0;

static void expect(bool ok, const char *what) {
  checks++;
  if (ok) return;
  printf("FAIL %s\n", what);
  failures++;
}

/* n values of dtype dt, normal * scale; every 53rd a tie, NaN at the given stride (0: none) */
static std::vector<unsigned char> values(int dt, int64_t n, float scale, uint32_t seed,
                                         int64_t nan_every) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<unsigned char> v((size_t)(n * sim_esize(dt) + 16));
  for (int64_t i = 0; i < n; i++) {
    float f = nd(rng) * scale;
    if (i % 53 == 7) f = 2.5f;
    if (nan_every && i % nan_every == 3) f = NAN;
    sim_put(v, dt, i, f);
  }
  return v;
}

static void check_axpby(int dt) {
  const int64_t n = 1537;
  const auto x = values(dt, n, 1.0f, 1, 0), y = values(dt, n, 3.0f, 2, 0);
  std::vector<unsigned char> sim(x.size()), ref(x.size());
  char what[96];
  for (int with_y = 0; with_y < 2; with_y++) {
    const void *yp = with_y ? y.data() : nullptr;
    expect(lk_axpby(x.data(), 0.3f, yp, -1.7f, sim.data(), dt, n, nullptr) == cudaSuccess,
           "axpby launch");
    cpu::lutra_cpu_axpby(x.data(), 0.3f, yp, -1.7f, ref.data(), dt, n);
    snprintf(what, sizeof what, "axpby dt=%d y=%d", dt, with_y);
    expect(memcmp(sim.data(), ref.data(), (size_t)(n * sim_esize(dt))) == 0, what);
  }
}

static void check_argmax(int dt) {
  const int64_t rows = 5, cols = 777;
  const auto x = values(dt, rows * cols, 1.0f, 3, 41);
  std::vector<int32_t> sim(rows, -1), ref(rows, -2);
  expect(lk_rows_argmax(x.data(), dt, rows, cols, sim.data(), nullptr) == cudaSuccess,
         "argmax launch");
  cpu::lutra_cpu_rows_argmax(x.data(), dt, rows, cols, ref.data());
  char what[64];
  snprintf(what, sizeof what, "argmax dt=%d", dt);
  expect(sim == ref, what);
}

static void check_softmax() {
  const int64_t rows = 3, cols = 1000;
  const auto x = values(LUTRA_F32, rows * cols, 3.0f, 4, 0);
  std::vector<float> sim(rows * cols, NAN), ref(rows * cols);
  expect(lk_rows_softmax(x.data(), LUTRA_F32, rows, cols, 0.7f, sim.data(), LUTRA_F32, nullptr) ==
             cudaSuccess,
         "softmax launch");
  cpu::lutra_cpu_rows_softmax(x.data(), LUTRA_F32, rows, cols, 0.7f, ref.data(), LUTRA_F32);
  double worst = 0;
  for (size_t i = 0; i < sim.size(); i++)
    worst = std::isnan(sim[i]) ? INFINITY : std::max(worst, (double)std::fabs(sim[i] - ref[i]));
  printf("softmax: max |sim - cpu| %.3g\n", worst);
  expect(worst <= 2e-6, "softmax within 2e-6");
}

static void check_sample(int dt, float temperature, int top_k) {
  const int64_t rows = 32, cols = 300;
  const auto x = values(dt, rows * cols, 2.0f, 5 + (uint32_t)top_k, 0);
  std::vector<int32_t> sim(rows, -1), ref(rows, -2), best(rows);
  expect(lk_rows_sample(x.data(), dt, rows, cols, temperature, top_k, 99, sim.data(), nullptr) ==
             cudaSuccess,
         "sample launch");
  cpu::lutra_cpu_rows_sample(x.data(), dt, rows, cols, temperature, top_k, 99, ref.data());
  int agree = 0;
  for (int64_t r = 0; r < rows; r++)
    agree += sim[r] == ref[r];
  char what[96];
  snprintf(what, sizeof what, "sample dt=%d T=%g top_k=%d: %d of %lld rows as the cpu", dt,
           (double)temperature, top_k, agree, (long long)rows);
  printf("%s\n", what);
  expect(agree >= rows - 1, what);
  if (top_k == 1) {
    cpu::lutra_cpu_rows_argmax(x.data(), dt, rows, cols, best.data());
    expect(sim == best, "sample with top_k 1 is the argmax");
  }
}

int main() {
  for (int dt : {LUTRA_F32, LUTRA_BF16, LUTRA_F16})
    check_axpby(dt);
  for (int dt : {LUTRA_F32, LUTRA_BF16})
    check_argmax(dt);
  check_softmax();
  check_sample(LUTRA_F32, 1.0f, 0);
  check_sample(LUTRA_BF16, 0.8f, 20);
  check_sample(LUTRA_F32, 1.3f, 1);
  check_sample(LUTRA_F32, 0.5f, 299);
  printf("%d checks, %d failures\n", checks, failures);
  return failures ? 1 : 0;
}

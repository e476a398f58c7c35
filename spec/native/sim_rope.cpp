/* Runs the rotary position embedding kernel (kernels/rope/rope.cu) on the CPU, one std::thread
 * per CUDA thread, against the CPU backend (lutra_cpu_rope), byte for byte: every dtype, forward
 * and inverse, bshd and sbhd strides, in place and out of place (the pass-through elements of
 * rotary_dim < head_dim copied, or left alone in place), interleaved pairs, position offsets,
 * and the q and k heads of a packed QKV buffer rotated in place (the value heads' bytes checked
 * untouched). For checking the kernel's indexing on a machine without a GPU; the device run is
 * spec/gpu/rope_gpu.lua's.
 *
 *   make CUDA=0 && make build/sim_rope && ./build/sim_rope   (spec/rope_spec.lua runs it) */
#include "sim_harness.h"

#include <cmath>
#include <cstdio>
#include <random>

#define LKC_LAUNCH SIM_LAUNCH

#include "common/base.cuh"
#include "common/elements.cuh"
#include "common/f32.cuh"
#include "common/launch.cuh"
#include "rope/rope.cu"
#include "sim_cpu.h"

namespace {

struct rope_case {
  int dtype;
  bool sbhd, interleaved, in_place, inverse;
  int64_t b, s, h, d, rotary_dim, offset;
  int64_t heads_in_buffer; /* h plus the heads after them left alone (a packed QKV's v heads) */
  bool misaligned;         /* in and out one element past an aligned address: the scalar path */
};

int failures = 0;

/* (cos, sin) of p * base^(-2i/r), as the module builds it */
std::vector<float> table_of(int64_t rows, int64_t r) {
  std::vector<float> t((size_t)(rows * r));
  for (int64_t p = 0; p < rows; p++)
    for (int64_t i = 0; i < r / 2; i++) {
      const double a = (double)p * std::pow(10000.0, -2.0 * (double)i / (double)r);
      t[(size_t)((p * (r / 2) + i) * 2)] = (float)std::cos(a);
      t[(size_t)((p * (r / 2) + i) * 2 + 1)] = (float)std::sin(a);
    }
  return t;
}

void check(const rope_case &c, std::mt19937 &rng) {
  const int64_t token = c.heads_in_buffer * c.d, n = c.b * c.s * token;
  const int64_t rows = c.offset + c.s + 3;
  std::vector<float> table = table_of(rows, c.rotary_dim);
  const int64_t skip = c.misaligned ? 1 : 0, es = sim_esize(c.dtype);
  std::vector<unsigned char> in((size_t)((n + skip) * es));
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int64_t i = 0; i < n + skip; i++)
    sim_put(in, c.dtype, i, normal(rng));
  /* out of place: both outputs start as the same poison, so an element neither writes matches */
  std::vector<unsigned char> want(c.in_place ? in : std::vector<unsigned char>(in.size(), 0xA5));
  std::vector<unsigned char> got = want;
  lutra_rope_args a = {};
  a.table = table.data();
  a.b = c.b;
  a.s = c.s;
  a.h = c.h;
  a.d = c.d;
  a.rotary_dim = c.rotary_dim;
  const int64_t stride[4] = {c.sbhd ? token : c.s * token, c.sbhd ? c.b * token : token, c.d, 1};
  memcpy(a.in_stride, stride, sizeof stride);
  memcpy(a.out_stride, stride, sizeof stride);
  a.position_offset = c.offset;
  a.table_rows = rows;
  a.dtype = c.dtype;
  a.inverse = c.inverse;
  a.interleaved = c.interleaved;
  a.in = (c.in_place ? want.data() : in.data()) + skip * es;
  a.out = want.data() + skip * es;
  if (cpu::lutra_cpu_rope(&a) != LUTRA_OK) {
    std::printf("FAIL: the CPU refused the case\n");
    failures++;
    return;
  }
  a.in = (c.in_place ? got.data() : in.data()) + skip * es;
  a.out = got.data() + skip * es;
  const bool vec4 = vec4_ok(&a);
  if (lk_rope(&a, nullptr) != cudaSuccess) {
    std::printf("FAIL: the launcher refused the case\n");
    failures++;
    return;
  }
  const char *name = c.dtype == LUTRA_F32 ? "f32" : c.dtype == LUTRA_BF16 ? "bf16" : "f16";
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); i++)
    if (got[i] != want[i] && !bad++) first = i;
  /* in place, the heads after h (v) keep the input's bytes */
  size_t touched = 0;
  if (c.in_place)
    for (int64_t t = 0; t < c.b * c.s; t++)
      for (int64_t e = c.h * c.d; e < token; e++)
        for (int k = 0; k < sim_esize(c.dtype); k++) {
          const size_t at = (size_t)((skip + t * token + e) * es + k);
          touched += got[at] != in[at];
        }
  std::printf("%s %s %s%s%s%s b%lld s%lld h%lld/%lld d%lld r%lld offset %lld: %s\n", name,
              c.sbhd ? "sbhd" : "bshd", c.in_place ? "in place" : "out of place",
              c.interleaved ? " interleaved" : "", c.inverse ? " inverse" : "",
              vec4 ? " (4-wide)" : " (scalar)", (long long)c.b, (long long)c.s, (long long)c.h,
              (long long)c.heads_in_buffer, (long long)c.d, (long long)c.rotary_dim,
              (long long)c.offset, bad || touched ? "FAIL" : "same bytes");
  if (bad) std::printf("  %zu bytes differ, the first at byte %zu\n", bad, first);
  if (touched) std::printf("  %zu bytes of the heads after h changed\n", touched);
  failures += bad || touched;
}

} // namespace

int main() {
  std::mt19937 rng(12345);
  const int dtypes[] = {LUTRA_F32, LUTRA_BF16, LUTRA_F16};
  for (int dt : dtypes)
    for (int variant = 0; variant < 8; variant++) {
      rope_case c = {};
      c.dtype = dt;
      c.sbhd = variant & 1;
      c.in_place = variant & 2;
      c.inverse = variant & 4;
      c.b = 2;
      c.s = 5;
      c.h = 3;
      c.d = 12;
      c.rotary_dim = variant & 2 ? 12 : 8;
      c.offset = variant * 7;
      c.interleaved = variant == 5 || variant == 6;
      c.heads_in_buffer = c.in_place ? c.h + 2 : c.h; /* in place: a packed QKV, 2 v heads */
      check(c, rng);
    }
  /* more threads' work than a block has (heads x pairs over 128), and a partial rotation in
   * place */
  check({LUTRA_BF16, false, false, true, false, 1, 3, 6, 64, 48, 100, 9, false}, rng);
  check({LUTRA_F32, true, true, false, true, 3, 2, 5, 64, 64, 0, 5, false}, rng);
  /* the 4-wide path in place on a packed QKV and with pass-through, and the layouts it leaves
   * to the scalar path: a misaligned buffer, a head stride of no multiple of 4 */
  check({LUTRA_F32, false, false, true, true, 2, 3, 3, 16, 16, 2, 5, false}, rng);
  check({LUTRA_BF16, true, false, false, false, 2, 3, 3, 16, 8, 2, 3, false}, rng);
  check({LUTRA_BF16, false, false, false, true, 2, 3, 3, 16, 8, 2, 3, true}, rng);
  check({LUTRA_F16, false, false, false, false, 2, 3, 2, 14, 8, 2, 2, false}, rng);
  std::printf(failures ? "%d case(s) FAILED\n" : "all cases: the same bytes\n", failures);
  return failures ? 1 : 0;
}

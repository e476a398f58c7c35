/* Tuning probe for the MXFP8 quantize of bf16 inputs (rowwise + columnwise, E4M3): variants of
 * k_mx16 (kernels/quantize/cast_transpose_16bit.cu) timed side by side with a device-to-device copy
 * in one run (git history has its runs). Not part of the library: the variants take finite inputs
 * only. Diagnostic variants leave a stage out or store in the wrong places (their outputs are wrong
 * on purpose); the others are compared byte for byte with the first variant, the 128x64 kernel
 * k_mx16 was before (k_base).
 *
 *   nvcc -O3 -arch=sm_90 -std=c++17 -Ikernels -Isrc -Ibench -o build/mx_probe \
 *     bench/probes/mx_probe.cu
 *   build/mx_probe [dim ...]
 */
#include "common/codec.cuh"

#include <cooperative_groups.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "support/checks.h"

using namespace lkc;

struct Args {
  const void *x;
  uint8_t *data, *scale_inv, *col_data, *col_scale_inv;
  int64_t rows, cols, tiles_r, tiles_c, ntiles;
  float max_rcp;
};

/* diagnostic flags: stages left out */
enum {
  D_NO_ROW_SCALES = 1,
  D_NO_COL_SCALES = 2,
  D_NO_MATH = 4, /* codes are the inputs' high bytes, no amax, no scale */
  D_NO_COL_STORE = 8,
  D_NO_ROW_STORE = 16,
  D_NO_PREFETCH = 32,
};

static int g_sms = 132;

constexpr int MX_THREADS = 128;
constexpr int MX_TR = 128, MX_TC = 64;
constexpr int MX_BUF = MX_TR * MX_TC + 4 * MX_TC;
constexpr int MX_SMEM = 2 * MX_BUF;

__device__ __forceinline__ uint32_t mag2(uint32_t w) {
  return w & 0x7FFF7FFFu;
}
__device__ __forceinline__ uint32_t word_of(const uint4 &u, int j) {
  return j == 0 ? u.x : j == 1 ? u.y : j == 2 ? u.z : u.w;
}
__device__ __forceinline__ float value16(uint32_t w, int s) {
  return bits_f32(s ? w & 0xFFFF0000u : w << 16);
}

__device__ __forceinline__ void mx_amax(const uint4 (&x)[8], uint32_t (&rm)[4], uint32_t (&cm)[4]) {
#pragma unroll
  for (int p = 0; p < 4; p++) {
    uint32_t m[2];
#pragma unroll
    for (int q = 0; q < 2; q++) {
      const uint4 &u = x[2 * p + q];
      m[q] = __vmaxu2(__vmaxu2(mag2(u.x), mag2(u.y)), __vmaxu2(mag2(u.z), mag2(u.w)));
    }
    uint32_t v = __vmaxu2(__byte_perm(m[0], m[1], 0x5410), __byte_perm(m[0], m[1], 0x7632));
    v = __vmaxu2(v, __shfl_xor_sync(FULL_MASK, v, 1));
    rm[p] = __vmaxu2(v, __shfl_xor_sync(FULL_MASK, v, 2));
  }
#pragma unroll
  for (int j = 0; j < 4; j++) {
    uint32_t v = mag2(word_of(x[0], j));
#pragma unroll
    for (int i = 1; i < 8; i++)
      v = __vmaxu2(v, mag2(word_of(x[i], j)));
    v = __vmaxu2(v, __shfl_xor_sync(FULL_MASK, v, 8));
    cm[j] = __vmaxu2(v, __shfl_xor_sync(FULL_MASK, v, 16));
  }
}

__device__ __forceinline__ float mx_scale(uint32_t m, float max_rcp, uint32_t &e) {
  const float f = value16(m, 0) * max_rcp;
  const uint32_t u = f32_bits(f);
  e = u > 0x400000u ? (u + 0x7FFFFFu) >> 23 : 0u;
  return e ? bits_f32((254u - e) << 23) : 1.0f;
}

__device__ __forceinline__ uint2 encode8(const float (&v)[8], float s) {
  uint32_t w[2];
#pragma unroll
  for (int j = 0; j < 2; j++)
    w[j] = fp8x2<LUTRA_E4M3>(v[4 * j] * s, v[4 * j + 1] * s) |
           (fp8x2<LUTRA_E4M3>(v[4 * j + 2] * s, v[4 * j + 3] * s) << 16);
  return make_uint2(w[0], w[1]);
}

/* high bytes of 8 values (D_NO_MATH) */
__device__ __forceinline__ uint2 hi8(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  return make_uint2(__byte_perm(a, b, 0x7531), __byte_perm(c, d, 0x7531));
}

template <int B>
__device__ __forceinline__ void tile_origin(const Args &a, uint32_t tile, int64_t &r0,
                                            int64_t &c0) {
  const uint32_t tiles_r = (uint32_t)a.tiles_r, per_band = B * (uint32_t)a.tiles_c;
  const uint32_t band = tile / per_band, rem = tile - band * per_band;
  const uint32_t h = min((uint32_t)B, tiles_r - band * B);
  const uint32_t tc = rem / h;
  r0 = (int64_t)(band * B + (rem - tc * h)) * MX_TR;
  c0 = (int64_t)tc * MX_TC;
}

/* k_mx16 of the library (finite inputs only: the probe's inputs have no NaN or inf) */
template <int DIAG, int B, int MINB>
__global__ void __launch_bounds__(MX_THREADS, MINB) k_base(Args a) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, k = lane & 7, h = lane >> 3;
  const int64_t rows = a.rows, cols = a.cols;
  constexpr bool PREFETCH = !(DIAG & D_NO_PREFETCH);
  uint4 next[8] = {};
  int64_t nr0 = 0, nc0 = 0;
  const uint32_t ntiles = (uint32_t)a.ntiles;
  auto load_tile = [&](uint32_t tile) {
    tile_origin<B>(a, tile, nr0, nc0);
    const int64_t r = nr0 + 32 * warp + 8 * h, c = nc0 + 8 * k;
    const uint4 *p =
        reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(a.x) + r * cols + c);
    if (r < rows && c < cols) {
#pragma unroll
      for (int i = 0; i < 8; i++)
        next[i] = __ldg(p + i * (cols / 8));
    }
  };
  if (PREFETCH && blockIdx.x < ntiles) load_tile(blockIdx.x);
  int buf = 0;
  for (uint32_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
    if (!PREFETCH) load_tile(tile);
    const int64_t r0 = nr0, c0 = nc0;
    const int64_t r = r0 + 32 * warp + 8 * h, c = c0 + 8 * k;
    const bool in = r < rows && c < cols;
    uint8_t *d = a.data + r * cols + c;
    uint8_t *sc = a.scale_inv + r * (cols >> 5) + (c >> 5);
    uint4 x[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
      x[i] = next[i];
    if (PREFETCH && tile + gridDim.x < ntiles) load_tile(tile + gridDim.x);
    uint8_t *sb = smem + buf * MX_BUF;
    uint32_t rm[4] = {0u, 0u, 0u, 0u}, cm[4] = {0u, 0u, 0u, 0u};
    if (!(DIAG & D_NO_MATH)) mx_amax(x, rm, cm);
    if (in && !(DIAG & D_NO_ROW_STORE)) {
#pragma unroll
      for (int i = 0; i < 8; i++) {
        uint2 code;
        uint32_t e = 0;
        if (DIAG & D_NO_MATH) {
          code = hi8(x[i].x, x[i].y, x[i].z, x[i].w);
        } else {
          const float s = mx_scale((rm[i >> 1] >> (16 * (i & 1))) & 0xFFFFu, a.max_rcp, e);
          float v[8];
#pragma unroll
          for (int j = 0; j < 8; j++)
            v[j] = value16(word_of(x[i], j >> 1), j & 1);
          code = encode8(v, s);
        }
        *reinterpret_cast<uint2 *>(d + i * cols) = code;
        if (!(DIAG & D_NO_ROW_SCALES) && (k & 3) == 0) sc[i * (cols >> 5)] = (uint8_t)e;
      }
    }
    {
      uint32_t es[2] = {0u, 0u};
#pragma unroll
      for (int jj = 0; jj < 8; jj++) {
        uint2 code;
        uint32_t e = 0;
        if (DIAG & D_NO_MATH) {
          code = hi8(word_of(x[0], jj >> 1) << (16 * (1 - (jj & 1))),
                     word_of(x[1], jj >> 1) << (16 * (1 - (jj & 1))),
                     word_of(x[2], jj >> 1) << (16 * (1 - (jj & 1))),
                     word_of(x[3], jj >> 1) << (16 * (1 - (jj & 1))));
        } else {
          const float s = mx_scale((cm[jj >> 1] >> (16 * (jj & 1))) & 0xFFFFu, a.max_rcp, e);
          float v[8];
#pragma unroll
          for (int i = 0; i < 8; i++)
            v[i] = value16(word_of(x[i], jj >> 1), jj & 1);
          code = encode8(v, s);
        }
        *reinterpret_cast<uint2 *>(sb + MX_TR * (8 * k + jj) + 16 * ((2 * warp + (h >> 1)) ^ k) +
                                   8 * (h & 1)) = code;
        es[jj >> 2] |= e << (8 * (jj & 3));
      }
      if (h == 0)
        *reinterpret_cast<uint2 *>(sb + MX_TR * MX_TC + MX_TC * warp + 8 * k) =
            make_uint2(es[0], es[1]);
    }
    __syncthreads();
    if (!(DIAG & D_NO_COL_STORE)) {
#pragma unroll
      for (int it = 0; it < MX_TR * MX_TC / 16 / MX_THREADS; it++) {
        const int u = t + MX_THREADS * it, cc = u >> 3, g = u & 7;
        const uint4 w = *reinterpret_cast<const uint4 *>(sb + MX_TR * cc + 16 * (g ^ (cc >> 3)));
        if (c0 + cc < cols && r0 + 16 * g < rows)
          *reinterpret_cast<uint4 *>(a.col_data + (c0 + cc) * rows + r0 + 16 * g) = w;
      }
    }
    if (!(DIAG & D_NO_COL_SCALES) && t < MX_TC && c0 + t < cols) {
      const uint8_t *s = sb + MX_TR * MX_TC + t;
      const int64_t nb = rows / 32, b0 = r0 / 32;
      uint8_t *dd = a.col_scale_inv + (c0 + t) * nb + b0;
      if (nb - b0 >= 4 && ((uintptr_t)dd & 3u) == 0) {
        *reinterpret_cast<uint32_t *>(dd) = (uint32_t)s[0] | (uint32_t)s[MX_TC] << 8 |
                                            (uint32_t)s[2 * MX_TC] << 16 |
                                            (uint32_t)s[3 * MX_TC] << 24;
      } else {
        for (int w = 0; w < 4 && b0 + w < nb; w++)
          dd[w] = s[w * MX_TC];
      }
    }
    buf ^= 1;
  }
}

#include "mx_probe_sq.cuh"

/* ---- harness --------------------------------------------------------------------------------- */

__global__ void k_fill(uint16_t *x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    /* sign, exponent spread over about 2^-8 .. 2^8 by blocks of 64 columns, random mantissa */
    const uint32_t ex = 119u + ((h >> 24) & 15u);
    x[i] = (uint16_t)(((h & 1u) << 15) | (ex << 7) | ((h >> 8) & 0x7Fu));
  }
}

struct Variant {
  const char *name;
  void (*launch)(const Args &, int grid_mode, cudaStream_t);
  bool diag;
  int grid_mode; /* 0: persistent grid from occupancy; 1: one block per tile; n > 1: n per SM */
};

template <auto K> static unsigned grid_of(const Args &a, int grid_mode, int smem) {
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, K, MX_THREADS, smem));
  int64_t g = (int64_t)g_sms * (grid_mode > 1 ? grid_mode : per_sm);
  if (grid_mode == 1 || g > a.ntiles) g = a.ntiles;
  return (unsigned)g;
}

template <int DIAG, int B, int MINB>
static void launch_base(const Args &a, int grid_mode, cudaStream_t s) {
  constexpr auto K = k_base<DIAG, B, MINB>;
  static bool set = false;
  if (!set) {
    CK(cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize, MX_SMEM));
    set = true;
  }
  K<<<grid_of<K>(a, grid_mode, MX_SMEM), MX_THREADS, MX_SMEM, s>>>(a);
}

static const Variant variants[] = {
    {"128x64 persistent (k_mx16 before)", launch_base<0, 16, 4>, false, 0},
    {"128x64, one block per tile", launch_base<0, 16, 4>, false, 1},
    {"128x128, one block per tile", launch_sq<0>, false, 1},
    {"128x128, scales evict_last (k_mx16)", launch_sq<F_SC_EVICT_LAST>, false, 1},
    {"128x128, code stores evict_first", launch_sq<F_ST_EVICT_FIRST>, false, 1},
    {"128x128, cp.async pipeline, 2/SM", launch_pipe, false, 0},
    {"128x128 in 8-tile clusters", launch_cl, false, 0},
    {"diag: 128x128, no scales", launch_sq<F_NO_SCALES>, true, 1},
    {"diag: 128x128, scales stored contiguously", launch_sq<F_SCALES_LINEAR>, true, 1},
    {"diag: 128x64, no math", launch_base<D_NO_MATH, 16, 4>, true, 0},
    {"diag: 128x64, no row codes/scales", launch_base<D_NO_ROW_STORE | D_NO_ROW_SCALES, 16, 4>,
     true, 0},
};
constexpr int NV = sizeof variants / sizeof variants[0];

static void run_dim(int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  Args a{};
  void *x, *copy_dst;
  CK(cudaMalloc(&x, 2 * n));
  CK(cudaMalloc(&copy_dst, 2 * n));
  CK(cudaMalloc(&a.data, n));
  CK(cudaMalloc(&a.col_data, n));
  CK(cudaMalloc(&a.scale_inv, n / 32));
  CK(cudaMalloc(&a.col_scale_inv, n / 32));
  k_fill<<<1024, 256>>>(static_cast<uint16_t *>(x), n, 12345u);
  a.x = x;
  a.rows = rows;
  a.cols = cols;
  a.tiles_r = (rows + MX_TR - 1) / MX_TR;
  a.tiles_c = (cols + MX_TC - 1) / MX_TC;
  a.ntiles = a.tiles_r * a.tiles_c;
  a.max_rcp = 1.0f / 448.0f;
  cudaStream_t s;
  CK(cudaStreamCreate(&s));

  /* reference outputs: variant 0 */
  std::vector<uint8_t> ref_d(n), ref_cd(n), ref_s(n / 32), ref_cs(n / 32), got(n);
  auto poison = [&] {
    CK(cudaMemsetAsync(a.data, 0xA5, n, s));
    CK(cudaMemsetAsync(a.col_data, 0xA5, n, s));
    CK(cudaMemsetAsync(a.scale_inv, 0xA5, n / 32, s));
    CK(cudaMemsetAsync(a.col_scale_inv, 0xA5, n / 32, s));
  };
  poison();
  variants[0].launch(a, variants[0].grid_mode, s);
  CK(cudaStreamSynchronize(s));
  CK(cudaMemcpy(ref_d.data(), a.data, n, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(ref_cd.data(), a.col_data, n, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(ref_s.data(), a.scale_inv, n / 32, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(ref_cs.data(), a.col_scale_inv, n / 32, cudaMemcpyDeviceToHost));
  bool ok[NV];
  for (int v = 0; v < NV; v++) {
    ok[v] = true;
    if (variants[v].diag || v == 0) continue;
    poison();
    variants[v].launch(a, variants[v].grid_mode, s);
    CK(cudaStreamSynchronize(s));
    const std::pair<std::vector<uint8_t> *, uint8_t *> outs[4] = {
        {&ref_d, a.data}, {&ref_cd, a.col_data}, {&ref_s, a.scale_inv}, {&ref_cs, a.col_scale_inv}};
    for (auto &o : outs) {
      const size_t bytes = o.first->size();
      CK(cudaMemcpy(got.data(), o.second, bytes, cudaMemcpyDeviceToHost));
      if (memcmp(got.data(), o.first->data(), bytes) != 0) ok[v] = false;
    }
  }

  /* timing: rounds alternate the copy and every variant; medians over rounds */
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  constexpr int ROUNDS = 9, REPS = 10;
  std::vector<std::vector<float>> ms(NV + 1);
  for (int round = 0; round < ROUNDS; round++) {
    for (int v = -1; v < NV; v++) {
      auto issue = [&] {
        if (v < 0)
          CK(cudaMemcpyAsync(copy_dst, x, 2 * n, cudaMemcpyDeviceToDevice, s));
        else
          variants[v].launch(a, variants[v].grid_mode, s);
      };
      issue();
      CK(cudaEventRecord(e0, s));
      for (int r = 0; r < REPS; r++)
        issue();
      CK(cudaEventRecord(e1, s));
      CK(cudaEventSynchronize(e1));
      float t = 0;
      CK(cudaEventElapsedTime(&t, e0, e1));
      ms[v + 1].push_back(t / REPS);
    }
  }
  CK(cudaGetLastError());
  auto median = [](std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double copy_gbs = 4.0 * n / (median(ms[0]) * 1e6);
  printf("\n%lld x %lld bf16: copy %.0f GB/s (%.1f us)\n", (long long)rows, (long long)cols,
         copy_gbs, median(ms[0]) * 1e3);
  for (int v = 0; v < NV; v++) {
    const double t = median(ms[v + 1]);
    const double gbs = (4.0 + 1.0 / 16.0) * n / (t * 1e6);
    printf("  %-34s %7.1f us %6.0f GB/s %5.1f%% of copy %s\n", variants[v].name, t * 1e3, gbs,
           100.0 * gbs / copy_gbs,
           variants[v].diag ? "(diagnostic)"
           : ok[v]          ? "(bytes == base)"
                            : "(BYTES DIFFER)");
  }
  fflush(stdout);
  CK(cudaFree(x));
  CK(cudaFree(copy_dst));
  CK(cudaFree(a.data));
  CK(cudaFree(a.col_data));
  CK(cudaFree(a.scale_inv));
  CK(cudaFree(a.col_scale_inv));
  CK(cudaStreamDestroy(s));
}

int main(int argc, char **argv) {
  CK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0));
  std::vector<std::pair<int64_t, int64_t>> dims;
  for (int i = 1; i < argc; i++) {
    const long long r = atoll(argv[i]);
    dims.push_back({r, r});
  }
  if (dims.empty()) dims = {{8192, 8192}, {16384, 16384}};
  for (auto &d : dims)
    run_dim(d.first, d.second);
  return 0;
}

/* The norm kernels of two trees side by side in one process: a baseline copy (for instance the
 * last commit's kernels/norm/norm.cu, norm_rows.cuh and norm_quantize.cu) and this tree's, each
 * built by tools/norm_ab/variant.cu. Per case, on bf16 x [16384, 4096] with bf16 parameters
 * (bench/norm_throughput.c's shape): every output of both compared byte for byte (dgamma and
 * dbeta too: the same sums in the same order unless a tree changed them), then the two timed
 * in alternating batches, with the device-to-device copy of 4n bytes in the same batches.
 *   bash tools/norm_ab/run.sh BASE_COMMIT     (on the GPU machine; writes norm_ab.md) */
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels.h"

#include "support/checks.h"

extern "C" {
cudaError_t base_lk_layernorm_forward(const lutra_norm_args *, cudaStream_t);
cudaError_t base_lk_layernorm_backward(const lutra_norm_args *, const lk_scratch *, cudaStream_t);
cudaError_t base_lk_norm_quantize(const lutra_norm_quant_args *, cudaStream_t);
cudaError_t cand_lk_layernorm_forward(const lutra_norm_args *, cudaStream_t);
cudaError_t cand_lk_layernorm_backward(const lutra_norm_args *, const lk_scratch *, cudaStream_t);
cudaError_t cand_lk_norm_quantize(const lutra_norm_quant_args *, cudaStream_t);
}

static const int64_t R = 16384, H = 4096, N = R * H;

struct Buffers {
  void *y, *dx, *dgamma, *dbeta, *data, *col;
  float *mean, *rstd, *scale_inv, *col_scale_inv, *amax;
  float *cur_scale; /* current scaling's scale, which its first pass writes */
  uint32_t *work;   /* current scaling's arrival words (zero between calls) */
};

static void *dev(size_t bytes) {
  void *p;
  CK(cudaMalloc(&p, bytes));
  CK(cudaMemset(p, 0xA5, bytes)); /* poisoned: a value left unwritten shows as a mismatch */
  return p;
}

static Buffers make_buffers() {
  Buffers b;
  b.y = dev(N * 2), b.dx = dev(N * 2), b.dgamma = dev(H * 2), b.dbeta = dev(H * 2);
  b.data = dev(N), b.col = dev(N);
  b.mean = (float *)dev(R * 4), b.rstd = (float *)dev(R * 4);
  /* room for every layout's scales (block scaling: at most a byte or a float per 32 codes) */
  b.scale_inv = (float *)dev(N / 8), b.col_scale_inv = (float *)dev(N / 8);
  b.amax = (float *)dev(16);
  b.cur_scale = (float *)dev(16);
  b.work = (uint32_t *)dev(16);
  CK(cudaMemset(b.work, 0, 16));
  return b;
}

static void *x, *dy, *gamma_, *beta_, *copy_dst;
static float *scale;
static lk_scratch scratch;

static lutra_norm_args norm_args(const Buffers &b, bool rms) {
  lutra_norm_args a;
  memset(&a, 0, sizeof a);
  a.x = x, a.gamma = gamma_, a.beta = rms ? nullptr : beta_;
  a.dtype = LUTRA_BF16, a.param_dtype = LUTRA_BF16, a.rows = R, a.hidden = H, a.eps = 1e-5f;
  a.rms = rms;
  a.y = b.y, a.mean = rms ? nullptr : b.mean, a.rstd = b.rstd;
  a.dy = dy, a.dx = b.dx, a.dgamma = b.dgamma, a.dbeta = rms ? nullptr : b.dbeta;
  return a;
}

enum Kind { FWD, BWD, QUANT_ROW, QUANT_BOTH, QUANT_CURRENT, QUANT_MX, QUANT_BLOCK };
struct Case {
  const char *name;
  Kind kind;
  bool rms;
  double bytes_per_n; /* bytes moved per element */
};

static cudaError_t run(bool cand, const Case &c, Buffers &b) {
  lutra_norm_args a = norm_args(b, c.rms);
  if (c.kind == FWD)
    return cand ? cand_lk_layernorm_forward(&a, 0) : base_lk_layernorm_forward(&a, 0);
  if (c.kind == BWD)
    return cand ? cand_lk_layernorm_backward(&a, &scratch, 0)
                : base_lk_layernorm_backward(&a, &scratch, 0);
  lutra_norm_quant_args q;
  memset(&q, 0, sizeof q);
  q.norm = a;
  q.norm.y = nullptr, q.norm.mean = c.rms ? nullptr : b.mean;
  q.quant.out_dtype = LUTRA_E4M3;
  q.quant.data = b.data, q.quant.scale_inv = b.scale_inv;
  if (c.kind != QUANT_ROW) q.quant.col_data = b.col, q.quant.col_scale_inv = b.col_scale_inv;
  q.quant.scale = scale, q.quant.amax = b.amax;
  if (c.kind == QUANT_CURRENT) {
    q.current = 1, q.fp8_max = 448.0f, q.work = b.work;
    q.quant.scale = b.cur_scale;
  }
  q.scaling = c.kind == QUANT_MX      ? LUTRA_SCALING_MXFP8
              : c.kind == QUANT_BLOCK ? LUTRA_SCALING_BLOCK_1D
                                      : LUTRA_SCALING_TENSOR;
  return cand ? cand_lk_norm_quantize(&q, 0) : base_lk_norm_quantize(&q, 0);
}

static std::vector<unsigned char> get(const void *p, size_t n) {
  std::vector<unsigned char> v(n);
  CK(cudaMemcpy(v.data(), p, n, cudaMemcpyDeviceToHost));
  return v;
}

static int compare(const char *what, const void *p, const void *q, size_t n) {
  auto a = get(p, n), b = get(q, n);
  size_t bad = 0, first = n;
  for (size_t i = 0; i < n; i++)
    if (a[i] != b[i]) bad++, first = std::min(first, i);
  if (bad) printf("  MISMATCH %s: %zu of %zu bytes differ, first at %zu\n", what, bad, n, first);
  return bad ? 1 : 0;
}

static int check(const Case &c, Buffers &bb, Buffers &bc) {
  CK(run(false, c, bb));
  CK(run(true, c, bc));
  CK(cudaDeviceSynchronize());
  int bad = 0;
  if (c.kind == FWD) {
    bad += compare("y", bb.y, bc.y, N * 2);
    bad += compare("rstd", bb.rstd, bc.rstd, R * 4);
    if (!c.rms) bad += compare("mean", bb.mean, bc.mean, R * 4);
  } else if (c.kind == BWD) {
    bad += compare("dx", bb.dx, bc.dx, N * 2);
    bad += compare("dgamma", bb.dgamma, bc.dgamma, H * 2);
    if (!c.rms) bad += compare("dbeta", bb.dbeta, bc.dbeta, H * 2);
  } else {
    bad += compare("rowwise codes", bb.data, bc.data, N);
    if (c.kind != QUANT_ROW) bad += compare("columnwise codes", bb.col, bc.col, N);
    if (c.kind == QUANT_MX || c.kind == QUANT_BLOCK) {
      bad += compare("rowwise scales", bb.scale_inv, bc.scale_inv, N / 8);
      bad += compare("columnwise scales", bb.col_scale_inv, bc.col_scale_inv, N / 8);
      bad += compare("rstd", bb.rstd, bc.rstd, R * 4);
      if (!c.rms) bad += compare("mean", bb.mean, bc.mean, R * 4);
    } else {
      bad += compare("amax", bb.amax, bc.amax, 4);
      if (c.kind == QUANT_CURRENT) bad += compare("scale", bb.cur_scale, bc.cur_scale, 4);
    }
  }
  return bad;
}

static float batch(int which, const Case &c, Buffers &b, int calls) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0, 0));
  for (int i = 0; i < calls; i++) {
    if (which == 2)
      CK(cudaMemcpyAsync(copy_dst, x, N * 2, cudaMemcpyDeviceToDevice, 0));
    else
      CK(run(which == 1, c, b));
  }
  CK(cudaEventRecord(e1, 0));
  CK(cudaEventSynchronize(e1));
  float ms;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ms * 1000.0f / calls;
}

static float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main(int argc, char **argv) {
  const char *out = argc > 1 ? argv[1] : "norm_ab.md";
  x = dev(N * 2), dy = dev(N * 2), gamma_ = dev(H * 2), beta_ = dev(H * 2), copy_dst = dev(N * 2);
  scale = (float *)dev(16);
  CK(cudaMalloc(&scratch.bias_partial, sizeof(double) * LK_BIAS_PARTIALS));
  {
    /* bf16 normal-ish values from a fixed LCG: x ~ 1.5 + N(0, 1), dy, gamma ~ 1 + N(0, 0.1) */
    std::vector<uint16_t> h(N);
    uint64_t s = 12345;
    auto uni = [&] {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      return ((s >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    };
    auto bf = [](float f) {
      uint32_t u;
      memcpy(&u, &f, 4);
      return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
    };
    auto gauss = [&] { return (float)(sqrt(-2 * log(uni())) * cos(6.283185307179586 * uni())); };
    for (auto &v : h)
      v = bf(1.5f + gauss());
    CK(cudaMemcpy(x, h.data(), N * 2, cudaMemcpyHostToDevice));
    for (auto &v : h)
      v = bf(gauss());
    CK(cudaMemcpy(dy, h.data(), N * 2, cudaMemcpyHostToDevice));
    for (int64_t i = 0; i < H; i++)
      h[i] = bf(1.0f + 0.1f * gauss());
    CK(cudaMemcpy(gamma_, h.data(), H * 2, cudaMemcpyHostToDevice));
    for (int64_t i = 0; i < H; i++)
      h[i] = bf(0.1f * gauss());
    CK(cudaMemcpy(beta_, h.data(), H * 2, cudaMemcpyHostToDevice));
    float sc = 96.0f;
    CK(cudaMemcpy(scale, &sc, 4, cudaMemcpyHostToDevice));
  }
  Buffers bb = make_buffers(), bc = make_buffers();
  const Case cases[] = {
      {"LayerNorm forward", FWD, false, 4},
      {"RMSNorm forward", FWD, true, 4},
      {"LayerNorm backward (dx, dgamma, dbeta)", BWD, false, 6},
      {"RMSNorm backward (dx, dgamma)", BWD, true, 6},
      {"LayerNorm + FP8 delayed, rowwise", QUANT_ROW, false, 3},
      {"LayerNorm + FP8 delayed, rowwise + columnwise", QUANT_BOTH, false, 4},
      {"RMSNorm + FP8 delayed, rowwise + columnwise", QUANT_BOTH, true, 4},
      {"LayerNorm + FP8 current, rowwise + columnwise", QUANT_CURRENT, false, 6},
      {"LayerNorm + MXFP8, rowwise + columnwise", QUANT_MX, false, 4 + 1.0 / 16},
      {"LayerNorm + FP8 1x128 blocks, rowwise + columnwise", QUANT_BLOCK, false, 4 + 1.0 / 16},
  };
  FILE *f = fopen(out, "w");
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  fprintf(f,
          "Norm kernels side by side, %s, bf16 x [%lld, %lld], bf16 parameters; median of 9 "
          "alternating batches of 50 calls\n\n",
          prop.name, (long long)R, (long long)H);
  fprintf(f, "| what | bytes | base us | new us | new/base | base %% of copy | new %% of copy | "
             "outputs |\n|---|---|---:|---:|---:|---:|---:|---|\n");
  int failures = 0;
  for (const Case &c : cases) {
    const int bad = check(c, bb, bc);
    failures += bad;
    for (int w = 0; w < 3; w++) /* warm-up */
      batch(w, c, w == 1 ? bc : bb, 5);
    std::vector<float> tb, tc, tcopy;
    for (int rep = 0; rep < 9; rep++) {
      tb.push_back(batch(0, c, bb, 50));
      tc.push_back(batch(1, c, bc, 50));
      tcopy.push_back(batch(2, c, bb, 50));
    }
    const float mb = median(tb), mc = median(tc), mcopy = median(tcopy);
    /* the copy moves 4n bytes (n bf16 read and written) */
    const double pb = 100.0 * (c.bytes_per_n / 4.0) * mcopy / mb;
    const double pc = 100.0 * (c.bytes_per_n / 4.0) * mcopy / mc;
    fprintf(f, "| %s | %.4gn | %.1f | %.1f | %.3f | %.1f%% | %.1f%% | %s |\n", c.name,
            c.bytes_per_n, mb, mc, mc / mb, pb, pc, bad ? "DIFFER" : "identical");
    printf("%s: base %.1f us, new %.1f us (copy %.1f us) %s\n", c.name, mb, mc, mcopy,
           bad ? "DIFFER" : "identical");
  }
  fclose(f);
  return failures ? 1 : 0;
}

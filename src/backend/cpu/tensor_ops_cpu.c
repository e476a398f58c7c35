/* The tensor operations on the CPU (lutra/tensor_ops.h): the reference of
 * kernels/tensor/tensor_ops.cu. Rows are [rows, cols] of the input's dtype, read as f32. */
#include "backend/tensor_ops_shared.h"
#include "cpu.h"

LUTRA_TENSOR_OPS_DECLARE(lutra_cpu);

#include <math.h>
#include <string.h>

int lutra_cpu_axpby(const void *x, float alpha, const void *y, float beta, void *out, int dtype,
                    int64_t n) {
  static const char fn[] = "lutra_cpu_axpby";
  CHECK_FLOAT_DTYPE(dtype, "element");
  CHECK_ARG(n >= 0, "negative count %lld", (long long)n);
  CHECK_ARG(n == 0 || (x && out), "x or out is NULL");
  for (int64_t i = 0; i < n; i++) {
    float v = alpha * lutra_elem_load(x, dtype, i);
    if (y) {
      float w = beta * lutra_elem_load(y, dtype, i); /* rounded apart: no FMA, as on CUDA */
      v = v + w;
    }
    lutra_elem_store(out, dtype, i, v);
  }
  return LUTRA_OK;
}

int lutra_cpu_copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                      int64_t height) {
  static const char fn[] = "lutra_cpu_copy_2d";
  CHECK_ARG(height >= 0 && (height == 0 || (dst && src)), "bad arguments");
  for (int64_t r = 0; r < height; r++)
    memcpy((char *)dst + (size_t)r * dpitch, (const char *)src + (size_t)r * spitch, width);
  return LUTRA_OK;
}

static int check_rows(const void *x, int dtype, int64_t rows, int64_t cols, const void *out,
                      const char *fn) {
  CHECK_FLOAT_DTYPE(dtype, "input");
  CHECK_ARG(rows >= 0 && cols >= 1, "bad shape [%lld, %lld]", (long long)rows, (long long)cols);
  CHECK_ARG(rows == 0 || (x && out), "x or out is NULL");
  return LUTRA_OK;
}

int lutra_cpu_rows_argmax(const void *x, int dtype, int64_t rows, int64_t cols, int32_t *ids) {
  static const char fn[] = "lutra_cpu_rows_argmax";
  TRY(check_rows(x, dtype, rows, cols, ids, fn));
  for (int64_t r = 0; r < rows; r++) {
    int64_t best = -1;
    float bv = 0.0f;
    for (int64_t j = 0; j < cols; j++) {
      float v = lutra_elem_load(x, dtype, r * cols + j);
      if (v == v && (best < 0 || v > bv)) { /* NaNs ignored, the first on a tie */
        bv = v;
        best = j;
      }
    }
    ids[r] = (int32_t)(best < 0 ? 0 : best);
  }
  return LUTRA_OK;
}

int lutra_cpu_rows_softmax(const void *x, int dtype, int64_t rows, int64_t cols, float temperature,
                           void *out, int out_dtype) {
  static const char fn[] = "lutra_cpu_rows_softmax";
  TRY(check_rows(x, dtype, rows, cols, out, fn));
  CHECK_FLOAT_DTYPE(out_dtype, "output");
  for (int64_t r = 0; r < rows; r++) {
    const int64_t o = r * cols;
    float m = -INFINITY;
    for (int64_t j = 0; j < cols; j++)
      m = fmaxf(m, lutra_elem_load(x, dtype, o + j) / temperature);
    double sum = 0.0;
    for (int64_t j = 0; j < cols; j++)
      sum += expf(lutra_elem_load(x, dtype, o + j) / temperature - m);
    const float inv = (float)(1.0 / sum);
    for (int64_t j = 0; j < cols; j++)
      lutra_elem_store(out, out_dtype, o + j,
                       expf(lutra_elem_load(x, dtype, o + j) / temperature - m) * inv);
  }
  return LUTRA_OK;
}

/* the key of the k-th largest value of the row (bisection over the keys' bits, 32 passes) */
static uint32_t kth_key(const void *x, int dtype, int64_t o, int64_t cols, int64_t k) {
  uint32_t key = 0;
  for (int bit = 31; bit >= 0; bit--) {
    const uint32_t cand = key | (1u << bit);
    int64_t count = 0;
    for (int64_t j = 0; j < cols; j++)
      count += lutra_order_key(lutra_elem_load(x, dtype, o + j)) >= cand;
    if (count >= k) key = cand;
  }
  return key;
}

int lutra_cpu_rows_sample(const void *x, int dtype, int64_t rows, int64_t cols, float temperature,
                          int top_k, uint64_t seed, int32_t *ids) {
  static const char fn[] = "lutra_cpu_rows_sample";
  TRY(check_rows(x, dtype, rows, cols, ids, fn));
  for (int64_t r = 0; r < rows; r++) {
    const int64_t o = r * cols;
    const uint32_t kept = top_k > 0 && top_k < cols ? kth_key(x, dtype, o, cols, top_k) : 0;
    float m = -INFINITY;
    for (int64_t j = 0; j < cols; j++) {
      float v = lutra_elem_load(x, dtype, o + j);
      if (lutra_order_key(v) >= kept) m = fmaxf(m, v / temperature);
    }
    double sum = 0.0;
    for (int64_t j = 0; j < cols; j++) {
      float v = lutra_elem_load(x, dtype, o + j);
      if (lutra_order_key(v) >= kept) sum += expf(v / temperature - m);
    }
    const double target = (double)lutra_sample_uniform(seed, r) * sum;
    double acc = 0.0;
    int64_t pick = -1;
    for (int64_t j = 0; j < cols; j++) {
      float v = lutra_elem_load(x, dtype, o + j);
      if (lutra_order_key(v) < kept) continue;
      pick = j; /* the last kept one when rounding leaves the target beyond the sum */
      acc += expf(v / temperature - m);
      if (acc > target) break;
    }
    ids[r] = (int32_t)(pick < 0 ? 0 : pick);
  }
  return LUTRA_OK;
}

/* Embedding lookup and its weight gradient on the CPU: the reference of
 * kernels/embedding/embedding.cu (lutra_embedding_args). The gradient is exact to the kernel's
 * bits: each weight row's contributions are summed in f32 in increasing position order,
 * starting from 0, then rounded once into the gradient (or added once into the f32 main_grad). */
#include "cpu.h"

#include <stdlib.h>
#include <string.h>

static int check_ids(const lutra_embedding_args *a, const char *fn) {
  for (int64_t p = 0; p < a->n; p++)
    CHECK_ARG(a->ids[p] >= 0 && a->ids[p] < a->vocab,
              "id %d at position %lld is out of range [0, %lld)", (int)a->ids[p], (long long)p,
              (long long)a->vocab);
  return LUTRA_OK;
}

static int check_args(const lutra_embedding_args *a, const char *fn) {
  CHECK_ARG(a != NULL, "arguments are NULL");
  CHECK_FLOAT_DTYPE(a->dtype, "embedding");
  CHECK_ARG(a->n >= 0 && a->n <= INT32_MAX && a->dim > 0 && a->vocab > 0 && a->vocab <= INT32_MAX,
            "shape n %lld, dim %lld, vocab %lld", (long long)a->n, (long long)a->dim,
            (long long)a->vocab);
  CHECK_ARG(a->n == 0 || a->ids, "ids are NULL");
  return check_ids(a, fn);
}

int lutra_cpu_embedding_forward(const lutra_embedding_args *a) {
  static const char fn[] = "lutra_cpu_embedding_forward";
  TRY(check_args(a, fn));
  CHECK_ARG(a->weight && a->out, "weight and out must not be NULL");
  const size_t row = (size_t)a->dim * lutra_dtype_size(a->dtype);
  for (int64_t p = 0; p < a->n; p++)
    memcpy((char *)a->out + (size_t)p * row, (const char *)a->weight + (size_t)a->ids[p] * row,
           row);
  return LUTRA_OK;
}

int lutra_cpu_embedding_scratch(int64_t n, int64_t vocab, size_t *bytes) {
  (void)vocab;
  *bytes = (size_t)(n > 0 ? n : 1) * sizeof(uint64_t);
  return LUTRA_OK;
}

static int by_key(const void *x, const void *y) {
  const uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
  return (a > b) - (a < b);
}

int lutra_cpu_embedding_backward(const lutra_embedding_args *a) {
  static const char fn[] = "lutra_cpu_embedding_backward";
  TRY(check_args(a, fn));
  CHECK_ARG(a->dy && a->wgrad, "dy and wgrad must not be NULL");
  CHECK_ARG(a->n == 0 || (a->scratch && a->scratch_bytes >= a->n * (int64_t)sizeof(uint64_t)),
            "scratch of %lld bytes for %lld ids", (long long)a->scratch_bytes, (long long)a->n);
  const int64_t n = a->n, dim = a->dim;
  CHECK_ARG(a->accumulate >= LUTRA_EMBEDDING_OVERWRITE && a->accumulate <= LUTRA_EMBEDDING_ADD,
            "unknown accumulate mode %d", (int)a->accumulate);
  const int gdt = a->accumulate == LUTRA_EMBEDDING_ADD_F32 ? LUTRA_F32 : a->dtype;
  if (!a->accumulate) memset(a->wgrad, 0, (size_t)(a->vocab * dim) * lutra_dtype_size(a->dtype));
  /* (id, position) as one key: ids are in [0, 2^31) and positions distinct, so sorting the keys
   * orders by id, each id's positions in increasing order (what a stable sort by id gives) */
  uint64_t *key = a->scratch;
  for (int64_t p = 0; p < n; p++)
    key[p] = (uint64_t)(uint32_t)a->ids[p] << 32 | (uint64_t)p;
  qsort(key, (size_t)n, sizeof *key, by_key);
  for (int64_t b = 0, e; b < n; b = e) {
    const int64_t r = (int64_t)(key[b] >> 32);
    for (e = b + 1; e < n && (int64_t)(key[e] >> 32) == r; e++) {
    }
    for (int64_t d = 0; d < dim; d++) {
      float s = 0.0f;
      for (int64_t k = b; k < e; k++)
        s += lutra_elem_load(a->dy, a->dtype, (int64_t)(key[k] & 0xFFFFFFFFu) * dim + d);
      const int64_t at = r * dim + d;
      lutra_elem_store(a->wgrad, gdt, at,
                       a->accumulate ? lutra_elem_load(a->wgrad, gdt, at) + s : s);
    }
  }
  return LUTRA_OK;
}

/* Embedding lookup and its weight gradient (kernels.h; lutra_embedding_args). Semantics:
 * lutra_cpu_embedding_forward / _backward (src/backend/cpu/embedding_cpu.c), bit for bit.
 *
 * The backward is deterministic without float atomics: the (id, position) pairs are sorted by id
 * with CUB's device radix sort, which is stable, so each id's positions stay in increasing order;
 * then one block per distinct id (the first position of each run of equal sorted ids) sums that
 * row's dy rows in f32 in that order, from 0, a thread per column, and writes the row once: the
 * CPU's order exactly. The sort's temp storage and its key and value arrays are the caller's
 * scratch (lk_embedding_scratch bytes, asked once per number of ids), so the launches allocate
 * nothing and are captured into CUDA graphs as they are. Out-of-range ids set *bad_id (the CPU
 * refuses them instead): the forward writes NaN rows for them, the sort's keys map them to vocab,
 * and the sum skips that run. */
#include "common/elements.cuh"
#include "common/launch.cuh"

#include <cub/device/device_radix_sort.cuh>

using namespace lkc;

namespace {

constexpr int kThreads = 256;
constexpr int kRowThreads = 128;
constexpr int64_t kMaxBlocks = 1 << 16;

template <int DT>
__global__ void gather_kernel(const int32_t *__restrict__ ids, const void *__restrict__ weight,
                              void *__restrict__ out, int64_t n, int64_t dim, int64_t vocab,
                              int32_t *bad_id) {
  const int64_t total = n * dim;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t p = i / dim, d = i - p * dim;
    const int32_t id = ids[p];
    if (id < 0 || id >= vocab) {
      if (bad_id) *bad_id = 1; /* every writer stores the same value */
      st<DT>(out, i, __int_as_float(0x7FC00000));
    } else {
      st<DT>(out, i, ld<DT>(weight, id * dim + d));
    }
  }
}

/* keys: the ids, an out-of-range one as vocab; values: the positions */
__global__ void keys_kernel(const int32_t *__restrict__ ids, uint32_t *__restrict__ keys,
                            uint32_t *__restrict__ pos, int64_t n, int64_t vocab, int32_t *bad_id) {
  for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < n;
       p += (int64_t)gridDim.x * blockDim.x) {
    const int32_t id = ids[p];
    const bool ok = id >= 0 && id < vocab;
    if (!ok && bad_id) *bad_id = 1;
    keys[p] = ok ? static_cast<uint32_t>(id) : static_cast<uint32_t>(vocab);
    pos[p] = static_cast<uint32_t>(p);
  }
}

/* a block per run of equal sorted keys (started at its first index), a thread per column */
template <int DT, int kMode> /* LUTRA_EMBEDDING_OVERWRITE, _ADD_F32 or _ADD */
__global__ void row_sum_kernel(const uint32_t *__restrict__ keys, const uint32_t *__restrict__ pos,
                               const void *__restrict__ dy, void *__restrict__ wgrad, int64_t n,
                               int64_t dim, int64_t vocab) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const uint32_t key = keys[i];
    if ((i > 0 && keys[i - 1] == key) || key >= vocab) continue;
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
      float s = 0.0f;
      for (int64_t k = i; k < n && keys[k] == key; k++)
        s += ld<DT>(dy, static_cast<int64_t>(pos[k]) * dim + d);
      const int64_t at = static_cast<int64_t>(key) * dim + d;
      if constexpr (kMode == LUTRA_EMBEDDING_ADD_F32)
        static_cast<float *>(wgrad)[at] += s;
      else if constexpr (kMode == LUTRA_EMBEDDING_ADD)
        st<DT>(wgrad, at, ld<DT>(wgrad, at) + s);
      else
        st<DT>(wgrad, at, s);
    }
  }
}

/* the scratch: keys in and out, positions in and out (n words each), then CUB's temp storage */
struct scratch_layout {
  size_t words, temp_offset;
};
scratch_layout layout_of(int64_t n) {
  const size_t words = (static_cast<size_t>(n) * sizeof(uint32_t) + 255) / 256 * 256;
  return {words, 4 * words};
}

int end_bit_of(int64_t vocab) { /* bits that hold 0 .. vocab (vocab: the out-of-range key) */
  int bits = 1;
  while (bits < 32 && (static_cast<uint64_t>(1) << bits) <= static_cast<uint64_t>(vocab))
    bits++;
  return bits;
}

cudaError_t sort(void *temp, size_t *temp_bytes, uint32_t *keys_in, uint32_t *keys_out,
                 uint32_t *pos_in, uint32_t *pos_out, int64_t n, int64_t vocab, cudaStream_t s) {
  return cub::DeviceRadixSort::SortPairs(temp, *temp_bytes, keys_in, keys_out, pos_in, pos_out,
                                         static_cast<int>(n), 0, end_bit_of(vocab), s);
}

bool valid(const lutra_embedding_args *a) {
  return a && is_float_dtype(a->dtype) && a->n >= 0 && a->n <= INT32_MAX && a->dim > 0 &&
         a->vocab > 0 && a->vocab <= INT32_MAX && (a->n == 0 || a->ids);
}

int blocks_for(int64_t work, int threads) {
  return static_cast<int>(imin<int64_t>(cdiv<int64_t>(work, threads), kMaxBlocks));
}

} // namespace

extern "C" cudaError_t lk_embedding_forward(const lutra_embedding_args *a, cudaStream_t s) {
  if (!valid(a) || !a->weight || !a->out) return cudaErrorInvalidValue;
  if (a->n == 0) return cudaSuccess;
  return with_float_dtype(a->dtype, [&](auto tag) {
    constexpr int DT = decltype(tag)::value;
    gather_kernel<DT><<<blocks_for(a->n * a->dim, kThreads), kThreads, 0, s>>>(
        a->ids, a->weight, a->out, a->n, a->dim, a->vocab, a->bad_id);
    return cudaGetLastError();
  });
}

extern "C" cudaError_t lk_embedding_scratch(int64_t n, int64_t vocab, size_t *bytes) {
  if (n < 0 || n > INT32_MAX || vocab <= 0 || vocab > INT32_MAX || !bytes)
    return cudaErrorInvalidValue;
  size_t temp = 0;
  cudaError_t e = sort(nullptr, &temp, nullptr, nullptr, nullptr, nullptr, n, vocab, 0);
  if (e != cudaSuccess) return e;
  *bytes = layout_of(n).temp_offset + temp;
  return cudaSuccess;
}

extern "C" cudaError_t lk_embedding_backward(const lutra_embedding_args *a, cudaStream_t s) {
  if (!valid(a) || !a->dy || !a->wgrad || a->accumulate < LUTRA_EMBEDDING_OVERWRITE ||
      a->accumulate > LUTRA_EMBEDDING_ADD)
    return cudaErrorInvalidValue;
  const int64_t n = a->n, dim = a->dim, vocab = a->vocab;
  const size_t grad_bytes = static_cast<size_t>(vocab * dim) * (a->dtype == LUTRA_F32 ? 4u : 2u);
  if (!a->accumulate) {
    cudaError_t e = cudaMemsetAsync(a->wgrad, 0, grad_bytes, s);
    if (e != cudaSuccess) return e;
  }
  if (n == 0) return cudaSuccess;
  const scratch_layout l = layout_of(n);
  if (!a->scratch || a->scratch_bytes < static_cast<int64_t>(l.temp_offset))
    return cudaErrorInvalidValue;
  char *base = static_cast<char *>(a->scratch);
  uint32_t *keys_in = reinterpret_cast<uint32_t *>(base);
  uint32_t *keys_out = reinterpret_cast<uint32_t *>(base + l.words);
  uint32_t *pos_in = reinterpret_cast<uint32_t *>(base + 2 * l.words);
  uint32_t *pos_out = reinterpret_cast<uint32_t *>(base + 3 * l.words);
  size_t temp_bytes = static_cast<size_t>(a->scratch_bytes) - l.temp_offset;
  keys_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(a->ids, keys_in, pos_in, n, vocab,
                                                           a->bad_id);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  e = sort(base + l.temp_offset, &temp_bytes, keys_in, keys_out, pos_in, pos_out, n, vocab, s);
  if (e != cudaSuccess) return e;
  const int blocks = static_cast<int>(imin<int64_t>(n, kMaxBlocks));
  return with_float_dtype(a->dtype, [&](auto tag) {
    constexpr int DT = decltype(tag)::value;
    if (a->accumulate == LUTRA_EMBEDDING_ADD_F32)
      row_sum_kernel<DT, LUTRA_EMBEDDING_ADD_F32>
          <<<blocks, kRowThreads, 0, s>>>(keys_out, pos_out, a->dy, a->wgrad, n, dim, vocab);
    else if (a->accumulate == LUTRA_EMBEDDING_ADD)
      row_sum_kernel<DT, LUTRA_EMBEDDING_ADD>
          <<<blocks, kRowThreads, 0, s>>>(keys_out, pos_out, a->dy, a->wgrad, n, dim, vocab);
    else
      row_sum_kernel<DT, LUTRA_EMBEDDING_OVERWRITE>
          <<<blocks, kRowThreads, 0, s>>>(keys_out, pos_out, a->dy, a->wgrad, n, dim, vocab);
    return cudaGetLastError();
  });
}

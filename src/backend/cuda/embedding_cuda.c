/* The embedding on CUDA (the table's embedding entries): kernels/embedding/embedding.cu's
 * launchers on the calling thread's stream. The arguments the kernels cannot take are refused
 * here with a message; out-of-range ids are not (the kernels flag them on the device: reading
 * ids back would synchronize). The launches are issued directly, not through a launcher's graph
 * cache: the backward's radix sort is several kernels whose shape CUB picks per size, and a
 * whole step is captured into a CUDA graph by the caller anyway. */
#include "cuda_backend.h"

#include "kernels.h"

static int check(const lutra_embedding_args *a, const char *fn) {
  CHECK_ARG(a != NULL, "arguments are NULL");
  CHECK_ARG(a->n >= 0 && a->n <= INT32_MAX && a->dim > 0 && a->vocab > 0 && a->vocab <= INT32_MAX,
            "shape n %lld, dim %lld, vocab %lld (n and vocab at most 2^31 - 1)", (long long)a->n,
            (long long)a->dim, (long long)a->vocab);
  CHECK_ARG(a->dtype == LUTRA_F32 || a->dtype == LUTRA_BF16 || a->dtype == LUTRA_F16,
            "dtype %d is not f32, bf16 or f16", (int)a->dtype);
  return LUTRA_OK;
}

int lutra_cuda_embedding_forward(const lutra_embedding_args *a) {
  static const char fn[] = "lutra_cuda_embedding_forward";
  TRY(check(a, fn));
  return lutra_cuda_status(lk_embedding_forward(a, lutra_cuda_stream()), fn,
                           "kernel embedding_forward");
}

int lutra_cuda_embedding_backward(const lutra_embedding_args *a) {
  static const char fn[] = "lutra_cuda_embedding_backward";
  TRY(check(a, fn));
  return lutra_cuda_status(lk_embedding_backward(a, lutra_cuda_stream()), fn,
                           "kernel embedding_backward");
}

int lutra_cuda_embedding_scratch(int64_t n, int64_t vocab, size_t *bytes) {
  static const char fn[] = "lutra_cuda_embedding_scratch";
  CHECK_ARG(bytes != NULL, "bytes is NULL");
  return lutra_cuda_status(lk_embedding_scratch(n, vocab, bytes), fn, "radix sort size query");
}

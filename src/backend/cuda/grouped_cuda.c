/* GroupedLinear's grouped operations on CUDA (the table's grouped_quantize and grouped_gemm): the
 * kernels of kernels/grouped_quantize.cu and kernels/grouped_gemm_sm90.cu on the calling
 * thread's stream, the GEMM's workspace from the stream's one GEMM workspace. The splits stay
 * in device memory: nothing here reads them. */
#include "backend/grouped_layout.h"
#include "cuda_backend.h"
#include "grouped_kernels.h"

int lutra_cuda_grouped_quantize(const lutra_grouped_quant_args *a) {
  static const char fn[] = "lutra_cuda_grouped_quantize";
  CHECK_ARG(a && a->num > 0 && a->cols > 0 && a->out.align > 0 && a->scratch,
            "bad grouped quantization arguments");
  if (a->kind != LUTRA_QUANT_DELAYED && a->kind != LUTRA_QUANT_CURRENT)
    return lutra_error(LUTRA_EUNSUPPORTED, fn,
                       "GroupedLinear on cuda quantizes with per-tensor scaling (delayed or "
                       "current) only: the MXFP8 and block recipes have no grouped path yet");
  CHECK_ARG(a->out.dtype == LUTRA_E4M3 || a->out.dtype == LUTRA_E5M2, "output dtype %d is no FP8",
            (int)a->out.dtype);
  int64_t cap = a->xs ? (int64_t)a->num * lutra_grouped_roundup(a->rows_each, a->out.align)
                      : lutra_grouped_rows_cap(a->total_rows, a->num, a->out.align);
  return lutra_cuda_status(lk_grouped_quantize(a, cap, lutra_cuda_stream()), fn,
                           "kernel grouped_quantize");
}

/* the CUTLASS kernels' workspace for num experts, asked once per expert count and thread */
static size_t workspace_for(int num) {
  static _Thread_local int last_num = -1;
  static _Thread_local size_t last_bytes;
  if (num != last_num) {
    last_bytes = lk_grouped_gemm_workspace(num);
    last_num = num;
  }
  return last_bytes;
}

int lutra_cuda_grouped_gemm(const lutra_grouped_gemm_args *g) {
  static const char fn[] = "lutra_cuda_grouped_gemm";
  CHECK_ARG(g && g->num > 0 && g->scratch, "bad grouped GEMM arguments");
  if (g->dtype != LUTRA_BF16)
    return lutra_error(LUTRA_EUNSUPPORTED, fn,
                       "GroupedLinear on cuda runs in bf16 (its grouped GEMM has no %s kernels)",
                       lutra_dtype_name(g->dtype));
  void *ws;
  size_t have;
  TRY(lutra_cuda_workspace(workspace_for(g->num), &ws, &have));
  cudaError_t e = lk_grouped_gemm(g, ws, have, lutra_cuda_stream());
  if (e == cudaErrorNotSupported) {
    (void)cudaGetLastError();
    return lutra_error(LUTRA_EUNSUPPORTED, fn,
                       "no grouped GEMM kernel for this combination (in and out multiples of 16, "
                       "bf16 or per-tensor FP8 with an E4M3 weight, an sm_90 device; see "
                       "kernels/grouped_gemm_sm90.cu)");
  }
  if (e == cudaSuccess && g->pass == LUTRA_GROUPED_WGRAD && !g->fp8 && g->db)
    e = lk_grouped_dbias(g->dy, g->dtype, g->total_rows, g->out, g->num, g->splits, g->db,
                         g->bias_dtype, g->accumulate, lutra_cuda_stream());
  return lutra_cuda_status(e, fn, "grouped GEMM");
}

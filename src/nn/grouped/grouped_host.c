/* GroupedLinear's second path, for splits the host knows (a Lua table or a CPU tensor): one GEMM
 * per expert through the GEMM front (gemm/gemm.c), i.e. cuBLASLt plans cached per shape as a
 * Linear's (and replayed from one-GEMM graphs while the arguments repeat), issued in one go.
 * High precision only (bf16, and f32, which the grouped kernels do not take); FP8 always takes
 * the grouped path. Each expert's GEMMs are the ones a Linear runs, so on the CPU this path
 * equals num_gemms Linears bit for bit too. Which path is faster where is measured by
 * bench/grouped_bench.lua (the per_expert rows); the default is the grouped one. A pass whose
 * host split pattern (and buffers) came before is replayed as one graph
 * (nn/grouped/grouped_graphs.c). */
#include "nn/grouped/grouped_host.h"
#include "core/error.h"
#include "gemm/gemm.h"
#include "nn/grouped/grouped_graphs.h"
#include "runtime/tensor.h"

#include <string.h>

/* a [rows, cols] view of a module-owned or input buffer (the GEMM front reads these fields) */
static lutra_tensor view(const grouped_linear *g, const void *data, int64_t rows, int64_t cols,
                         int dtype) {
  lutra_tensor t;
  memset(&t, 0, sizeof t);
  t.data = (void *)data;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.numel = rows * cols;
  t.ndim = 2;
  t.dtype = dtype;
  t.device = g->device;
  t.flags = LUTRA_TENSOR_BORROWED;
  t.refs = 1;
  return t;
}

static size_t esize(const grouped_linear *g) {
  return lutra_dtype_size(g->dtype);
}

typedef struct host_pass {
  const lutra_tensor *x, *dy;
  bool dx_wanted;
} host_pass;

static int forward_calls(grouped_linear *g, void *ctx, const char *fn) {
  const lutra_tensor *x = ((const host_pass *)ctx)->x;
  int64_t r = 0;
  const size_t es = esize(g);
  const bool add_bias = g->has_bias && !g->skip_forward_bias; /* row-parallel: rank 0 only */
  for (int e = 0; e < g->num; e++) {
    const int64_t s = g->splits_host[e];
    if (s > 0) {
      lutra_tensor xe =
          view(g, (const char *)x->data + (size_t)(r * g->in) * es, s, g->in, g->dtype);
      lutra_tensor ye =
          view(g, (char *)g->y->data + (size_t)(r * g->out) * es, s, g->out, g->dtype);
      TRY(lutra_gemm_run(&(lutra_gemm_op){.a = g->weight[e],
                                          .b = &xe,
                                          .d = &ye,
                                          .bias = add_bias ? g->bias[e] : NULL,
                                          .transa = true},
                         fn));
    }
    r += s;
  }
  return LUTRA_OK;
}

static int backward_calls(grouped_linear *g, void *ctx, const char *fn) {
  const host_pass *p = ctx;
  const lutra_tensor *dy = p->dy;
  const bool dx_wanted = p->dx_wanted;
  int64_t r = 0;
  const size_t es = esize(g);
  const bool acc = g->accumulate_main_grad;
  for (int e = 0; e < g->num; e++) {
    const int64_t s = g->splits_host[e];
    lutra_tensor *dw = acc ? g->weight_main_grad[e] : g->wgrad[e];
    lutra_tensor *db = !g->has_bias ? NULL : acc ? g->bias_main_grad[e] : g->bgrad[e];
    lutra_tensor dye =
        view(g, (const char *)dy->data + (size_t)(r * g->out) * es, s, g->out, g->dtype);
    lutra_tensor xe =
        view(g, (const char *)g->x->data + (size_t)(r * g->in) * es, s, g->in, g->dtype);
    if (dx_wanted && s > 0) {
      lutra_tensor dxe =
          view(g, (char *)g->dx->data + (size_t)(r * g->in) * es, s, g->in, g->dtype);
      TRY(lutra_gemm_run(&(lutra_gemm_op){.a = g->weight[e], .b = &dye, .d = &dxe}, fn));
    }
    if (s == 0) { /* no rows: a zero gradient (nothing to add into main_grad) */
      if (!acc) {
        TRY(g->be->fill(dw->data, dw->dtype, dw->numel, 0.0f));
        if (db) TRY(g->be->fill(db->data, db->dtype, db->numel, 0.0f));
      }
      r += s;
      continue;
    }
    /* as a Linear: the bias gradient from the wgrad GEMM's BGRADB epilogue, or added by the
     * bias-gradient op when accumulating into main_grad */
    lutra_gemm_epilogue bgradb = {.kind = LUTRA_EPILOGUE_BGRADB, .dbias = db};
    TRY(lutra_gemm_run(&(lutra_gemm_op){.a = &xe,
                                        .b = &dye,
                                        .d = dw,
                                        .epilogue = db && !acc ? &bgradb : NULL,
                                        .transb = true,
                                        .accumulate = acc},
                       fn));
    if (db && acc)
      TRY(g->be->bias_grad(&(lutra_bias_grad_args){.dy = dye.data,
                                                   .dtype = g->dtype,
                                                   .rows = s,
                                                   .cols = g->out,
                                                   .db = db->data,
                                                   .db_dtype = db->dtype,
                                                   .accumulate = 1}));
    r += s;
  }
  return LUTRA_OK;
}

int lutra_grouped_host_forward(grouped_linear *g, const lutra_tensor *x, const char *fn) {
  host_pass p = {.x = x};
  const void *ptrs[LUTRA_GG_PTRS] = {x->data, g->y->data, NULL};
  return lutra_grouped_graphs_run(g, LUTRA_GG_FORWARD, ptrs, forward_calls, &p, fn);
}

int lutra_grouped_host_backward(grouped_linear *g, const lutra_tensor *dy, bool dx_wanted,
                                const char *fn) {
  host_pass p = {.dy = dy, .dx_wanted = dx_wanted};
  const void *ptrs[LUTRA_GG_PTRS] = {g->x->data, dy->data, dx_wanted ? g->dx->data : NULL};
  return lutra_grouped_graphs_run(g, dx_wanted ? LUTRA_GG_BACKWARD_DX : LUTRA_GG_BACKWARD, ptrs,
                                  backward_calls, &p, fn);
}

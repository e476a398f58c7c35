/* Gradient accumulation (optim/grad_accum.h). The sums are f32 whatever the gradients' dtype:
 * a bf16 sum of k micro-batches would lose what bf16 gradients of one already lack. Each add is
 * one or two backend calls per parameter (convert, add), each mean one (axpby): the same calls
 * every step, so a captured step with its micro-batches replays them. */
#include "optim/grad_accum.h"
#include "core/error.h"

#include <stdlib.h>
#include <string.h>

static int allocate(lutra_grad_accum *g, const lutra_optim_args *a, const char *fn) {
  int64_t largest = 0;
  g->sum = calloc((size_t)a->count, sizeof *g->sum);
  g->grad = calloc((size_t)a->count, sizeof *g->grad);
  g->dtype = calloc((size_t)a->count, sizeof *g->dtype);
  if (!g->sum || !g->grad || !g->dtype) {
    lutra_grad_accum_free(g);
    return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate the gradient sums' list");
  }
  g->count = a->count;
  for (int32_t i = 0; i < a->count; i++) {
    void *p;
    int st = g->be->alloc((size_t)a->numel[i] * 4, &p);
    if (st != LUTRA_OK) {
      lutra_grad_accum_free(g);
      return lutra_error_wrap(st, fn);
    }
    g->sum[i] = p;
    g->grad[i] = p;
    g->dtype[i] = LUTRA_F32;
    if (a->grad_dtype[i] != LUTRA_F32 && a->numel[i] > largest) largest = a->numel[i];
  }
  if (largest > 0) {
    void *p;
    int st = g->be->alloc((size_t)largest * 4, &p);
    if (st != LUTRA_OK) {
      lutra_grad_accum_free(g);
      return lutra_error_wrap(st, fn);
    }
    g->scratch = p;
  }
  return LUTRA_OK;
}

int lutra_grad_accum_add(lutra_grad_accum *g, const lutra_optim_args *a, const char *fn) {
  if (!g->sum) TRY(allocate(g, a, fn));
  const bool first = g->micro_batches == 0;
  for (int32_t i = 0; i < a->count; i++) {
    const int64_t n = a->numel[i];
    const void *src = a->grad[i];
    if (first) {
      TRY(g->be->convert(src, a->grad_dtype[i], g->sum[i], LUTRA_F32, n));
      continue;
    }
    if (a->grad_dtype[i] != LUTRA_F32) {
      TRY(g->be->convert(src, a->grad_dtype[i], g->scratch, LUTRA_F32, n));
      src = g->scratch;
    }
    TRY(g->be->add(g->sum[i], src, g->sum[i], LUTRA_F32, n));
  }
  g->micro_batches++;
  return LUTRA_OK;
}

int lutra_grad_accum_mean(lutra_grad_accum *g, const lutra_optim_args *a) {
  if (g->micro_batches < 2) return LUTRA_OK;
  const float inv = 1.0f / (float)g->micro_batches;
  for (int32_t i = 0; i < a->count; i++)
    TRY(g->be->axpby(g->sum[i], inv, NULL, 0.0f, g->sum[i], LUTRA_F32, a->numel[i]));
  return LUTRA_OK;
}

void lutra_grad_accum_free(lutra_grad_accum *g) {
  for (int32_t i = 0; g->sum && i < g->count; i++)
    if (g->sum[i]) g->be->free(g->sum[i]);
  if (g->scratch) g->be->free(g->scratch);
  free(g->sum);
  free(g->grad);
  free(g->dtype);
  const lutra_backend *be = g->be;
  memset(g, 0, sizeof *g);
  g->be = be;
}

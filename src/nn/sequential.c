/* Sequential: runs its children in order, and their backward in reverse, in one C call.
 *
 * A Linear followed by a GELU runs as one GEMM with the GELU in its epilogue (GELU_AUX(_BIAS),
 * the pre-activation kept for backward), and a Linear right after such a GELU applies gelu' in
 * its dgrad GEMM (DGELU), so the GELU costs no pass over memory of its own in either direction,
 * as in TransformerEngine's LayerNormMLP. Where a GEMM cannot take it (FP8 dgrad), gelu' goes
 * into the grad_output cast of the Linear before the GELU (delayed scaling), else the GELU's own
 * backward runs. lutra_sequential_fusions counts what the last forward/backward fused. */
#include "core/error.h"
#include "core/object.h"
#include "nn/module.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct sequential {
  lutra_module base;
  int count;
  lutra_module **mods;
  bool *linear_gelu;        /* [i]: mods[i] is a Linear and mods[i + 1] a GELU */
  const lutra_tensor **pre; /* [i]: the pre-activation the last forward fused at i, or NULL */
  int fused_forward, fused_backward; /* pairs fused by the last forward / backward */
} sequential;

static int seq_forward(lutra_module *m, const lutra_tensor *x, int first_microbatch,
                       lutra_tensor **y) {
  sequential *s = (sequential *)m;
  const lutra_tensor *h = x;
  lutra_tensor *out = NULL;
  s->fused_forward = 0;
  for (int i = 0; i < s->count; i++)
    s->pre[i] = NULL;
  for (int i = 0; i < s->count; i++) {
    if (s->linear_gelu[i]) {
      lutra_tensor *pre;
      TRY(lutra_linear_forward_gelu(s->mods[i], h, first_microbatch, &out, &pre));
      lutra_gelu_adopt(s->mods[i + 1], pre, out);
      s->pre[i] = pre;
      s->fused_forward++;
      i++; /* the GELU ran in the GEMM */
    } else {
      TRY(s->mods[i]->ops->forward(s->mods[i], h, first_microbatch, &out));
    }
    h = out;
  }
  *y = out;
  return LUTRA_OK;
}

/* dx NULL: the input's gradient is not wanted, so the first module computes none */
static int seq_backward(lutra_module *m, const lutra_tensor *dy, lutra_tensor **dx) {
  sequential *s = (sequential *)m;
  const lutra_tensor *g = dy;
  lutra_tensor *out = NULL;
  s->fused_backward = 0;
  lutra_tensor **input_grad = dx ? &out : NULL; /* for the module that takes the input */
  for (int i = s->count - 1; i >= 0; i--) {
    /* a Linear after a GELU whose forward was fused: gelu' goes into its dgrad GEMM */
    const lutra_tensor *pre = i >= 2 && lutra_module_is_linear(s->mods[i]) ? s->pre[i - 2] : NULL;
    if (pre) {
      bool fused;
      TRY(lutra_linear_backward_dgelu(s->mods[i], g, pre, &out, &fused)); /* i >= 2 */
      g = out;
      if (fused) {
        s->fused_backward++;
        i--; /* the GELU's backward is done */
      }
      continue;
    }
    /* a GELU fused into the Linear before it, whose FP8 grad_output cast can apply gelu' */
    if (i >= 1 && s->pre[i - 1] && lutra_linear_takes_gelu_grad(s->mods[i - 1])) {
      TRY(lutra_linear_backward_gelu(s->mods[i - 1], g, i == 1 ? input_grad : &out));
      g = out;
      s->fused_backward++;
      i--; /* the Linear's backward is done too */
      continue;
    }
    TRY(s->mods[i]->ops->backward(s->mods[i], g, i == 0 ? input_grad : &out));
    g = out;
  }
  if (dx) *dx = out;
  return LUTRA_OK;
}

static int seq_num_params(const lutra_module *m) {
  const sequential *s = (const sequential *)m;
  int n = 0;
  for (int i = 0; i < s->count; i++)
    n += s->mods[i]->ops->num_params(s->mods[i]);
  return n;
}

static int seq_param(const lutra_module *m, int i, lutra_param *out) {
  const sequential *s = (const sequential *)m;
  for (int c = 0; c < s->count; c++) {
    int n = s->mods[c]->ops->num_params(s->mods[c]);
    if (i < n) return s->mods[c]->ops->param(s->mods[c], i, out);
    i -= n;
  }
  return LUTRA_EINVAL;
}

static void seq_release(lutra_module *m) {
  sequential *s = (sequential *)m;
  for (int i = 0; i < s->count; i++)
    lutra_module_free(s->mods[i]);
  free(s->mods);
  free(s->linear_gelu);
  free(s->pre);
  s->mods = NULL;
  s->linear_gelu = NULL;
  s->pre = NULL;
  s->count = 0;
}

static const lutra_module_ops seq_ops = {
    .kind = "sequential",
    .forward = seq_forward,
    .backward = seq_backward,
    .num_params = seq_num_params,
    .param = seq_param,
    .release = seq_release,
};

int lutra_sequential_new(lutra_module *const *mods, int n, lutra_module **out) {
  static const char fn[] = "lutra_sequential_new";
  CHECK_ARG(out, "out is NULL");
  CHECK_ARG(n >= 1, "a Sequential needs at least one module (got %d)", n);
  CHECK_ARG(mods, "mods is NULL");
  for (int i = 0; i < n; i++) {
    char what[32];
    snprintf(what, sizeof what, "module %d", i + 1);
    TRY(lutra_check_object(mods[i], LUTRA_MAGIC_MODULE, fn, what));
  }
  sequential *s = calloc(1, sizeof *s);
  lutra_module **copy = calloc((size_t)n, sizeof *copy);
  bool *linear_gelu = calloc((size_t)n, sizeof *linear_gelu);
  const lutra_tensor **pre = calloc((size_t)n, sizeof *pre);
  if (!s || !copy || !linear_gelu || !pre) {
    free(s);
    free(copy);
    free(linear_gelu);
    free(pre);
    return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a module");
  }
  memcpy(copy, mods, (size_t)n * sizeof *copy);
  /* a module listed twice would run its fused and plain halves on one set of buffers */
  for (int i = 0; i + 1 < n; i++) {
    bool repeated = false;
    for (int j = 0; j < n; j++)
      repeated |= j != i && j != i + 1 && (copy[j] == copy[i] || copy[j] == copy[i + 1]);
    linear_gelu[i] = !repeated && lutra_module_is_linear(copy[i]) &&
                     lutra_module_is_gelu(copy[i + 1]) && (i == 0 || !linear_gelu[i - 1]);
  }
  for (int i = 0; i < n; i++)
    lutra_module_retain(copy[i]);
  s->base.obj.magic = LUTRA_MAGIC_MODULE;
  s->base.obj.refs = 1;
  s->base.ops = &seq_ops;
  s->count = n;
  s->mods = copy;
  s->linear_gelu = linear_gelu;
  s->pre = pre;
  *out = &s->base;
  return LUTRA_OK;
}

int lutra_sequential_fusions(const lutra_module *m, int *forward, int *backward) {
  static const char fn[] = "lutra_sequential_fusions";
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  CHECK_ARG(m->ops == &seq_ops, "module is a %s, not a sequential", m->ops->kind);
  CHECK_ARG(forward && backward, "output pointers must not be NULL");
  const sequential *s = (const sequential *)m;
  *forward = s->fused_forward;
  *backward = s->fused_backward;
  return LUTRA_OK;
}

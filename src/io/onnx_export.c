/* lutra_export_onnx (lutra/onnx.h): a module tree walked once into an ONNX graph
 * (io/onnx_graph.h), each supported kind as standard operators, then serialized with protobuf-c.
 * The whole graph is built in memory before anything is written, so that a kind the export does
 * not know, a shape that does not chain or a parameter that cannot be read leaves no file.
 * Without ONNX export in the build (Makefile: ONNX=0) the call checks its arguments and refuses. */
#include "core/error.h"
#include "core/object.h"
#include "lutra.h"

#include <string.h>

#ifdef LUTRA_WITH_ONNX
#include "io/onnx_graph.h"
#include "nn/export_view.h"
#include "nn/module.h"

#include <stdio.h>
#include <stdlib.h>

enum { PATH_MAX_LEN = 256 };

typedef struct exporter {
  onnx_graph g;
  const char *fn;
  int fp8_weights; /* linear-like modules exported with their FP8 weight dequantized */
} exporter;

/* where the forward is: the value holding it and its last dim */
typedef struct flow {
  const char *v;
  int64_t features;
} flow;

static int emit(exporter *e, const lutra_module *m, const char *path, flow *f);

static const char *shown(const char *path) {
  return path[0] ? path : "the root";
}

/* path.leaf, or leaf at the root */
static void join(char *out, const char *path, const char *leaf) {
  snprintf(out, PATH_MAX_LEN, "%s%s%s", path, path[0] ? "." : "", leaf);
}

/* the graph's sticky allocation failure as a status */
static int built(exporter *e, const char *v) {
  if (v && !e->g.oom) return LUTRA_OK;
  return lutra_error(LUTRA_ENOMEM, e->fn, "cannot allocate the ONNX graph");
}

/* parameter i of m as f32 on the host (BF16 widened, a CUDA tensor copied; from src instead of
 * the parameter's value when src is not NULL: an FP8 weight, dequantized), malloc'ed */
static int read_param(exporter *e, const lutra_module *m, int i, const lutra_tensor *src,
                      const char *path, float **out, lutra_tensor **value) {
  lutra_param p;
  TRY(lutra_module_param(m, i, &p));
  const lutra_tensor *t = src ? src : p.value;
  float *buf = malloc((size_t)t->numel * sizeof *buf);
  if (!buf) return lutra_error(LUTRA_ENOMEM, e->fn, "cannot allocate %s's parameters", path);
  int st = lutra_tensor_get_f32(t, buf, t->numel);
  if (st != LUTRA_OK) {
    free(buf);
    char why[512]; /* the message is rewritten below: not formatted from itself */
    snprintf(why, sizeof why, "%s", lutra_last_error());
    return lutra_error(st, e->fn, "cannot read parameter %d of %s: %s", i, shown(path), why);
  }
  *out = buf;
  *value = p.value;
  return LUTRA_OK;
}

/* y = x W^T + b with m's parameters first (W [out, in]) and first + 1 (b, when m has it): MatMul
 * by the transposed weight, stored [in, out], then Add */
static int emit_linear(exporter *e, const lutra_module *m, int first, const lutra_tensor *wq,
                       const char *path, flow *f) {
  float *w, *b = NULL;
  lutra_tensor *wt, *bt = NULL;
  TRY(read_param(e, m, first, wq, path, &w, &wt));
  const int64_t out = wt->shape[0], in = wt->shape[1];
  int n;
  TRY(lutra_module_num_params(m, &n));
  int st = in == f->features
               ? LUTRA_OK
               : lutra_error(LUTRA_EINVAL, e->fn, "%s takes %lld features, its input has %lld",
                             shown(path), (long long)in, (long long)f->features);
  float *wt_data = st == LUTRA_OK ? malloc((size_t)(in * out) * sizeof *wt_data) : NULL;
  if (st == LUTRA_OK && !wt_data) st = lutra_error(LUTRA_ENOMEM, e->fn, "cannot allocate");
  if (st == LUTRA_OK && n > first + 1) st = read_param(e, m, first + 1, NULL, path, &b, &bt);
  if (st != LUTRA_OK) {
    free(w);
    free(wt_data);
    return st;
  }
  for (int64_t o = 0; o < out; o++)
    for (int64_t i = 0; i < in; i++)
      wt_data[i * out + o] = w[o * in + i];
  char name[PATH_MAX_LEN];
  join(name, path, "weight");
  const char *v =
      onnx_op2(&e->g, "MatMul", f->v,
               onnx_init_f32(&e->g, name, 2, (const int64_t[]){in, out}, wt_data), "matmul");
  if (b) {
    join(name, path, "bias");
    v = onnx_op2(&e->g, "Add", v, onnx_init_f32(&e->g, name, 1, &out, b), "linear");
  }
  free(w);
  free(wt_data);
  free(b);
  if (wq) {
    char key[PATH_MAX_LEN + 16];
    snprintf(key, sizeof key, "lutra.fp8%s%s", path[0] ? "." : "", path);
    static const char *const scaling[] = {"unscaled", "per-tensor scaling", "MXFP8 1x32 blocks",
                                          "1x128 blocks", "128x128 tiles"};
    char what[96];
    snprintf(what, sizeof what, "dequantized %s, %s", lutra_dtype_name(wq->dtype),
             wq->scaling >= 0 && wq->scaling <= 4 ? scaling[wq->scaling] : "scaled");
    onnx_meta(&e->g, key, what);
    e->fp8_weights++;
  }
  f->v = v;
  f->features = out;
  return built(e, v);
}

/* LayerNorm as LayerNormalization (opset 17); RMSNorm decomposed, x / sqrt(mean(x^2) + eps) g,
 * as the opsets up to 21 have no RMSNormalization. Parameters first (gamma) and first + 1 (beta,
 * LayerNorm's); a zero-centered gamma is stored as gamma + 1. */
static int emit_norm(exporter *e, const lutra_module *m, int first, const lutra_norm_desc *d,
                     const char *path, flow *f) {
  const char *fn = e->fn; /* for CHECK_ARG */
  CHECK_ARG(d->hidden == f->features, "%s normalizes %lld features, its input has %lld",
            shown(path), (long long)d->hidden, (long long)f->features);
  float *gamma, *beta = NULL;
  lutra_tensor *unused;
  TRY(read_param(e, m, first, NULL, path, &gamma, &unused));
  if (!d->rms) {
    int st = read_param(e, m, first + 1, NULL, path, &beta, &unused);
    if (st != LUTRA_OK) {
      free(gamma);
      return st;
    }
  }
  for (int64_t i = 0; d->zero_centered_gamma && i < d->hidden; i++)
    gamma[i] += 1.0f;
  char name[PATH_MAX_LEN];
  join(name, path, "weight");
  onnx_graph *gr = &e->g;
  const char *g = onnx_init_f32(gr, name, 1, &d->hidden, gamma), *v;
  if (d->rms) {
    const char *sq = onnx_op2(gr, "Mul", f->v, f->v, "sq"), *ms;
    if (gr->opset >= 18) { /* the axes became an input */
      ms = onnx_op2(gr, "ReduceMean", sq, onnx_init_i64(gr, (const int64_t[]){-1}, 1), "ms");
    } else {
      ms = onnx_op1(gr, "ReduceMean", sq, "ms");
      onnx_attr_ints(gr, "axes", (const int64_t[]){-1}, 1);
    }
    onnx_attr_int(gr, "keepdims", 1);
    const char *rms =
        onnx_op1(gr, "Sqrt", onnx_op2(gr, "Add", ms, onnx_scalar(gr, d->eps), "var"), "rms");
    v = onnx_op2(gr, "Mul", onnx_op2(gr, "Div", f->v, rms, "xhat"), g, "rmsnorm");
  } else {
    join(name, path, "bias");
    v = onnx_op(gr, "LayerNormalization", 3,
                (const char *const[]){f->v, g, onnx_init_f32(gr, name, 1, &d->hidden, beta)},
                "layernorm");
    onnx_attr_int(gr, "axis", -1);
    onnx_attr_float(gr, "epsilon", d->eps);
  }
  free(gamma);
  free(beta);
  f->v = v;
  return built(e, v);
}

/* an element-wise activation of x, as nn/activation.c's formulas (backend/args_activation.h) */
static const char *element_act(onnx_graph *g, int act, const char *x) {
  switch (act) {
  case LUTRA_ACT_RELU:
    return onnx_op1(g, "Relu", x, "relu");
  case LUTRA_ACT_SRELU: {
    const char *r = onnx_op1(g, "Relu", x, "relu");
    return onnx_op2(g, "Mul", r, r, "squared_relu");
  }
  case LUTRA_ACT_SILU:
    return onnx_op2(g, "Mul", x, onnx_op1(g, "Sigmoid", x, "sigmoid"), "silu");
  case LUTRA_ACT_TANH:
    return onnx_op1(g, "Tanh", x, "tanh");
  case LUTRA_ACT_QGELU: /* x sigmoid(1.702 x) */
    return onnx_op2(
        g, "Mul", x,
        onnx_op1(g, "Sigmoid", onnx_op2(g, "Mul", x, onnx_scalar(g, 1.702f), "kx"), "sigmoid"),
        "quick_gelu");
  case LUTRA_ACT_GELU_ERF: { /* 0.5 x (1 + erf(x / sqrt 2)) */
    const char *erf = onnx_op1(
        g, "Erf", onnx_op2(g, "Mul", x, onnx_scalar(g, 0.70710678118654752f), "xs"), "erf");
    const char *half_x = onnx_op2(g, "Mul", x, onnx_scalar(g, 0.5f), "half_x");
    return onnx_op2(g, "Mul", half_x, onnx_op2(g, "Add", erf, onnx_scalar(g, 1.0f), "erf1"),
                    "gelu_erf");
  }
  default: { /* GELU_TANH: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
    const char *x3 = onnx_op2(g, "Mul", onnx_op2(g, "Mul", x, x, "x2"), x, "x3");
    const char *u =
        onnx_op2(g, "Add", x, onnx_op2(g, "Mul", x3, onnx_scalar(g, 0.044715f), "ax3"), "u");
    const char *t = onnx_op1(
        g, "Tanh", onnx_op2(g, "Mul", u, onnx_scalar(g, 0.7978845608028654f), "cu"), "tanh");
    const char *half_x = onnx_op2(g, "Mul", x, onnx_scalar(g, 0.5f), "half_x");
    return onnx_op2(g, "Mul", half_x, onnx_op2(g, "Add", t, onnx_scalar(g, 1.0f), "tanh1"), "gelu");
  }
  }
}

/* columns [from, to) of the last dim */
static const char *last_dim_slice(onnx_graph *g, const char *x, int64_t from, int64_t to) {
  return onnx_op(g, "Slice", 4,
                 (const char *const[]){x, onnx_init_i64(g, &from, 1), onnx_init_i64(g, &to, 1),
                                       onnx_init_i64(g, (const int64_t[]){-1}, 1)},
                 "half");
}

/* an activation module; gated kinds: the input's first half a is the gate, y = f(a) b */
static int emit_activation(exporter *e, int act, const char *path, flow *f) {
  const char *fn = e->fn; /* for CHECK_ARG */
  onnx_graph *g = &e->g;
  if (!lutra_act_is_gated(act)) {
    f->v = element_act(g, act, f->v);
    return built(e, f->v);
  }
  CHECK_ARG(f->features % 2 == 0, "%s is gated and takes an even number of features, not %lld",
            shown(path), (long long)f->features);
  const int64_t h = f->features / 2;
  static const int gate_of[LUTRA_ACT_COUNT] = {
      [LUTRA_ACT_SWIGLU] = LUTRA_ACT_SILU,
      [LUTRA_ACT_GEGLU] = LUTRA_ACT_GELU_TANH,
      [LUTRA_ACT_REGLU] = LUTRA_ACT_RELU,
  };
  const char *a = last_dim_slice(g, f->v, 0, h), *b = last_dim_slice(g, f->v, h, 2 * h);
  f->v = onnx_op2(g, "Mul", element_act(g, gate_of[act], a), b, "gated");
  f->features = h;
  return built(e, f->v);
}

static int emit_sequential(exporter *e, const lutra_module *m, const char *path, flow *f) {
  int n;
  TRY(lutra_sequential_count(m, &n));
  for (int i = 0; i < n; i++) {
    const char *name = NULL;
    const lutra_module *c = m->ops->checkpoint->child(m, i, &name);
    char index[16], child[PATH_MAX_LEN];
    snprintf(index, sizeof index, "%d", i);
    join(child, path, name ? name : index);
    TRY(emit(e, c, child, f));
  }
  return LUTRA_OK;
}

/* y = x + m(x); the wrapped module's names are the residual's own (no level added) */
static int emit_residual(exporter *e, const lutra_module *m, const char *path, flow *f) {
  const char *fn = e->fn; /* for CHECK_ARG */
  const char *unused;
  const lutra_module *inner = m->ops->checkpoint->child(m, 0, &unused);
  flow h = *f;
  TRY(emit(e, inner, path, &h));
  CHECK_ARG(h.features == f->features,
            "%s is a residual whose module gives %lld features for an input of %lld", shown(path),
            (long long)h.features, (long long)f->features);
  f->v = onnx_op2(&e->g, "Add", f->v, h.v, "residual");
  return built(e, f->v);
}

/* a LayerNormLinear: its norm's parameters (1 for RMSNorm, 2) named <path>.norm.*, then the
 * Linear's */
static int emit_layernorm_linear(exporter *e, const lutra_module *m, const lutra_norm_desc *d,
                                 const lutra_tensor *wq, const char *path, flow *f) {
  char norm[PATH_MAX_LEN];
  join(norm, path, "norm");
  TRY(emit_norm(e, m, 0, d, norm, f));
  return emit_linear(e, m, d->rms ? 1 : 2, wq, path, f);
}

/* a LayerNormMLP's chain: fc1 (the LayerNormLinear), its activation, fc2 */
static int emit_layernorm_mlp(exporter *e, const lutra_module *chain, const char *path, flow *f) {
  static const char *const part[] = {"fc1", "act", "fc2"};
  for (int i = 0; i < 3; i++) {
    const char *unused;
    char child[PATH_MAX_LEN];
    join(child, path, part[i]);
    TRY(emit(e, chain->ops->checkpoint->child(chain, i, &unused), child, f));
  }
  return LUTRA_OK;
}

static int emit(exporter *e, const lutra_module *m, const char *path, flow *f) {
  const char *kind = m->ops->kind;
  lutra_norm_desc d;
  const lutra_tensor *wq;
  const lutra_module *chain;
  int act = lutra_module_activation(m);
  if (act != LUTRA_ACT_NONE) return emit_activation(e, act, path, f);
  if (lutra_norm_view(m, &d)) return emit_norm(e, m, 0, &d, path, f);
  if (lutra_layernorm_linear_view(m, &d, &wq)) return emit_layernorm_linear(e, m, &d, wq, path, f);
  if ((chain = lutra_layernorm_mlp_chain_view(m))) return emit_layernorm_mlp(e, chain, path, f);
  if (!strcmp(kind, "linear"))
    return emit_linear(e, m, 0, lutra_linear_fp8_weight_view(m), path, f);
  if (!strcmp(kind, "sequential")) return emit_sequential(e, m, path, f);
  if (!strcmp(kind, "residual")) return emit_residual(e, m, path, f);
  return lutra_error(LUTRA_EINVAL, e->fn,
                     "%s is of kind %s, which ONNX export does not support (sequential, linear, "
                     "layernorm, rmsnorm, layernorm_linear, layernorm_mlp, residual and the "
                     "activations are)",
                     path[0] ? path : "the module", kind);
}

#endif /* LUTRA_WITH_ONNX */

int lutra_onnx_available(void) {
#ifdef LUTRA_WITH_ONNX
  return 1;
#else
  return 0;
#endif
}

void lutra_onnx_defaults(lutra_onnx_options *o) {
  if (!o) return;
  *o = (lutra_onnx_options){.opset = 17, .ndim = 2, .input_name = "input", .output_name = "output"};
}

int lutra_export_onnx(const lutra_module *m, const char *path, const lutra_onnx_options *o) {
  static const char fn[] = "lutra_export_onnx";
  TRY(lutra_check_object(m, LUTRA_MAGIC_MODULE, fn, "module"));
  CHECK_ARG(path && path[0], "path is NULL or empty");
  CHECK_ARG(o, "options are NULL (start from lutra_onnx_defaults)");
  CHECK_ARG(o->opset >= 17 && o->opset <= 21, "opset %d is not one of 17..21", (int)o->opset);
  CHECK_ARG(o->ndim >= 1 && o->ndim <= LUTRA_MAX_DIMS, "input rank %d is not 1..%d", (int)o->ndim,
            LUTRA_MAX_DIMS);
  CHECK_ARG(o->input_shape[o->ndim - 1] > 0,
            "the input shape's last dim (the features) must be given, not %lld",
            (long long)o->input_shape[o->ndim - 1]);
  CHECK_ARG(o->input_name && o->input_name[0] && o->output_name && o->output_name[0] &&
                strcmp(o->input_name, o->output_name) != 0,
            "input_name and output_name must be two different non-empty names");
#ifndef LUTRA_WITH_ONNX
  return lutra_error(LUTRA_EUNSUPPORTED, fn,
                     "this lutra was built without ONNX export (make found no protoc-c or no "
                     "protobuf-c header, or ONNX=0 was given; Debian: protobuf-c-compiler "
                     "libprotobuf-c-dev, then rebuild)");
#else
  exporter e = {.fn = fn};
  onnx_graph_init(&e.g, o->opset);
  flow f = {.v = o->input_name, .features = o->input_shape[o->ndim - 1]};
  int st = emit(&e, m, "", &f);
  if (st == LUTRA_OK) {
    onnx_meta(&e.g, "lutra.module", m->ops->kind);
    onnx_meta(&e.g, "lutra.weights",
              e.fp8_weights ? "f32; the linear layers listed as lutra.fp8.<path> with the FP8 "
                              "weight (of that format) their last forward used, dequantized"
                            : "f32 (the modules' parameters, BF16 ones widened)");
    st = onnx_graph_write(&e.g, path, o->input_name, o->ndim, o->input_shape, f.v, o->output_name,
                          f.features, fn);
  }
  onnx_graph_free(&e.g);
  return st;
#endif
}

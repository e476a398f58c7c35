/* The ONNX graph builder (io/onnx_graph.h) and the model's serialization through protobuf-c.
 * Built only with ONNX export (Makefile: ONNX). */
#ifdef LUTRA_WITH_ONNX
#include "io/onnx_graph.h"

#include "core/error.h"
#include "io/checkpoint_temp.h"
#include "lutra.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void onnx_graph_init(onnx_graph *g, int64_t opset) {
  *g = (onnx_graph){.opset = opset};
}

void onnx_graph_free(onnx_graph *g) {
  for (size_t i = 0; i < g->n_allocs; i++)
    free(g->allocs[i]);
  free(g->allocs);
  *g = (onnx_graph){0};
}

/* room for one more entry in an array of n of cap (grown by doubling); false on oom */
static bool grow(onnx_graph *g, void **arr, size_t n, size_t *cap, size_t elem) {
  if (g->oom) return false;
  if (n < *cap) return true;
  size_t c = *cap ? 2 * *cap : 16;
  void *p = realloc(*arr, c * elem);
  if (!p) {
    g->oom = true;
    return false;
  }
  *arr = p;
  *cap = c;
  return true;
}

/* zeroed memory the graph owns */
static void *alloc(onnx_graph *g, size_t bytes) {
  if (!grow(g, (void **)&g->allocs, g->n_allocs, &g->cap_allocs, sizeof *g->allocs)) return NULL;
  void *p = calloc(1, bytes ? bytes : 1);
  if (!p) {
    g->oom = true;
    return NULL;
  }
  g->allocs[g->n_allocs++] = p;
  return p;
}

static char *dup_str(onnx_graph *g, const char *s) {
  char *d = alloc(g, strlen(s) + 1);
  if (d) strcpy(d, s);
  return d;
}

static char *fresh_name(onnx_graph *g, const char *hint) {
  char buf[96];
  snprintf(buf, sizeof buf, "%s_%d", hint, g->next_value++);
  return dup_str(g, buf);
}

/* appends item to the array *arr of *n entries and room for *cap: a full array is replaced by one
 * twice its size, from alloc (the old one stays owned by the graph until it goes); false on oom or
 * when item is NULL (a builder that failed before) */
static bool push(onnx_graph *g, void ***arr, size_t *n, size_t *cap, void *item) {
  if (!item) return false;
  if (*n == *cap) {
    size_t c = *cap ? 2 * *cap : 16;
    void **p = alloc(g, c * sizeof *p);
    if (!p) return false;
    if (*n) memcpy(p, *arr, *n * sizeof *p);
    *arr = p; /* the old array stays in allocs until the graph goes */
    *cap = c;
  }
  (*arr)[(*n)++] = item;
  return true;
}

const char *onnx_op(onnx_graph *g, const char *op, int n_in, const char *const *in,
                    const char *hint) {
  if (g->oom) return NULL;
  Onnx__NodeProto *node = alloc(g, sizeof *node);
  char **ins = alloc(g, (size_t)n_in * sizeof *ins);
  char **outs = alloc(g, sizeof *outs);
  if (!node || !ins || !outs) return NULL;
  onnx__node_proto__init(node);
  for (int i = 0; i < n_in; i++) {
    if (!in[i]) return NULL; /* an operand a failed builder did not make */
    ins[i] = dup_str(g, in[i]);
  }
  outs[0] = fresh_name(g, hint);
  node->op_type = dup_str(g, op);
  node->name = outs[0] ? dup_str(g, outs[0]) : NULL;
  node->n_input = (size_t)n_in;
  node->input = ins;
  node->n_output = 1;
  node->output = outs;
  if (!push(g, (void ***)&g->node, &g->n_node, &g->cap_node, node)) return NULL;
  return g->oom ? NULL : outs[0];
}

const char *onnx_op1(onnx_graph *g, const char *op, const char *a, const char *hint) {
  return onnx_op(g, op, 1, (const char *const[]){a}, hint);
}

const char *onnx_op2(onnx_graph *g, const char *op, const char *a, const char *b,
                     const char *hint) {
  return onnx_op(g, op, 2, (const char *const[]){a, b}, hint);
}

/* a new attribute on the last node */
static Onnx__AttributeProto *attr(onnx_graph *g, const char *name,
                                  Onnx__AttributeProto__AttributeType type) {
  if (g->oom || g->n_node == 0) return NULL;
  Onnx__NodeProto *node = g->node[g->n_node - 1];
  Onnx__AttributeProto *a = alloc(g, sizeof *a);
  if (!a) return NULL;
  onnx__attribute_proto__init(a);
  a->name = dup_str(g, name);
  a->has_type = 1;
  a->type = type;
  size_t cap = node->n_attribute; /* a node has a few attributes: every addition regrows */
  if (!push(g, (void ***)&node->attribute, &node->n_attribute, &cap, a)) return NULL;
  return a;
}

void onnx_attr_int(onnx_graph *g, const char *name, int64_t v) {
  Onnx__AttributeProto *a = attr(g, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT);
  if (!a) return;
  a->has_i = 1;
  a->i = v;
}

void onnx_attr_float(onnx_graph *g, const char *name, float v) {
  Onnx__AttributeProto *a = attr(g, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT);
  if (!a) return;
  a->has_f = 1;
  a->f = v;
}

void onnx_attr_ints(onnx_graph *g, const char *name, const int64_t *v, int n) {
  Onnx__AttributeProto *a = attr(g, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
  int64_t *ints = alloc(g, (size_t)n * sizeof *ints);
  if (!a || !ints) return;
  memcpy(ints, v, (size_t)n * sizeof *ints);
  a->n_ints = (size_t)n;
  a->ints = ints;
}

/* an initializer of data_type with dims; its data set by the caller */
static Onnx__TensorProto *init_tensor(onnx_graph *g, const char *name, int32_t data_type, int ndim,
                                      const int64_t *dims) {
  if (g->oom) return NULL;
  Onnx__TensorProto *t = alloc(g, sizeof *t);
  int64_t *d = alloc(g, (size_t)ndim * sizeof *d);
  if (!t || !d) return NULL;
  onnx__tensor_proto__init(t);
  if (ndim) memcpy(d, dims, (size_t)ndim * sizeof *d); /* a scalar has no dims (NULL) */
  t->n_dims = (size_t)ndim;
  t->dims = d;
  t->has_data_type = 1;
  t->data_type = data_type;
  t->name = dup_str(g, name);
  if (!push(g, (void ***)&g->init, &g->n_init, &g->cap_init, t)) return NULL;
  return g->oom ? NULL : t;
}

/* numel of dims; raw_data holds the values little-endian, as the schema asks (this library is
 * built for little-endian hosts only, as safetensors' files are read) */
static bool set_raw(onnx_graph *g, Onnx__TensorProto *t, const void *data, size_t bytes) {
  uint8_t *raw = alloc(g, bytes);
  if (!t || !raw) return false;
  memcpy(raw, data, bytes);
  t->has_raw_data = 1;
  t->raw_data = (ProtobufCBinaryData){.len = bytes, .data = raw};
  return true;
}

const char *onnx_init_f32(onnx_graph *g, const char *name, int ndim, const int64_t *dims,
                          const float *data) {
  size_t n = 1;
  for (int i = 0; i < ndim; i++)
    n *= (size_t)dims[i];
  Onnx__TensorProto *t = init_tensor(g, name, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, ndim, dims);
  return set_raw(g, t, data, n * sizeof(float)) ? t->name : NULL;
}

const char *onnx_init_i64(onnx_graph *g, const int64_t *v, int n) {
  char *name = fresh_name(g, "const");
  if (!name) return NULL;
  Onnx__TensorProto *t =
      init_tensor(g, name, ONNX__TENSOR_PROTO__DATA_TYPE__INT64, 1, (const int64_t[]){n});
  return set_raw(g, t, v, (size_t)n * sizeof *v) ? t->name : NULL;
}

const char *onnx_scalar(onnx_graph *g, float v) {
  char *name = fresh_name(g, "const");
  if (!name) return NULL;
  Onnx__TensorProto *t = init_tensor(g, name, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 0, NULL);
  return set_raw(g, t, &v, sizeof v) ? t->name : NULL;
}

void onnx_meta(onnx_graph *g, const char *key, const char *value) {
  if (g->oom) return;
  Onnx__StringStringEntryProto *e = alloc(g, sizeof *e);
  if (!e) return;
  onnx__string_string_entry_proto__init(e);
  e->key = dup_str(g, key);
  e->value = dup_str(g, value);
  push(g, (void ***)&g->meta, &g->n_meta, &g->cap_meta, e);
}

/* a value's type: f32 of shape dims (dim i <= 0: symbolic, "batch" for 0, "d<i>" after) */
static Onnx__ValueInfoProto *value_info(onnx_graph *g, const char *name, int ndim,
                                        const int64_t *dims) {
  Onnx__ValueInfoProto *v = alloc(g, sizeof *v);
  Onnx__TypeProto *type = alloc(g, sizeof *type);
  Onnx__TypeProto__Tensor *tt = alloc(g, sizeof *tt);
  Onnx__TensorShapeProto *shape = alloc(g, sizeof *shape);
  Onnx__TensorShapeProto__Dimension **dim = alloc(g, (size_t)ndim * sizeof *dim);
  if (g->oom) return NULL;
  onnx__value_info_proto__init(v);
  onnx__type_proto__init(type);
  onnx__type_proto__tensor__init(tt);
  onnx__tensor_shape_proto__init(shape);
  for (int i = 0; i < ndim; i++) {
    if (!(dim[i] = alloc(g, sizeof *dim[i]))) return NULL;
    onnx__tensor_shape_proto__dimension__init(dim[i]);
    if (dims[i] > 0) {
      dim[i]->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
      dim[i]->dim_value = dims[i];
    } else {
      char sym[16];
      snprintf(sym, sizeof sym, i == 0 ? "batch" : "d%d", i);
      dim[i]->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
      dim[i]->dim_param = dup_str(g, sym);
    }
  }
  shape->n_dim = (size_t)ndim;
  shape->dim = dim;
  tt->has_elem_type = 1;
  tt->elem_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
  tt->shape = shape;
  type->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
  type->tensor_type = tt;
  v->name = dup_str(g, name);
  v->type = type;
  return g->oom ? NULL : v;
}

/* the IR version an opset's release came with (onnx/helper.py's VERSION_TABLE) */
static int64_t ir_version(int64_t opset) {
  return opset >= 21 ? 10 : opset >= 19 ? 9 : 8;
}

static int write_file(const char *path, const uint8_t *buf, size_t len, const char *fn) {
  char *tmp = NULL;
  int fd = ckpt_create_temp(path, &tmp, fn);
  if (fd < 0) return LUTRA_EINVAL; /* the error set by ckpt_create_temp */
  FILE *f = fdopen(fd, "wb");
  if (!f) close(fd);
  bool ok = f && fwrite(buf, 1, len, f) == len;
  int err = errno;
  if (f && fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (ok && rename(tmp, path) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok) remove(tmp);
  free(tmp);
  if (!ok) return lutra_error(LUTRA_EINVAL, fn, "cannot write '%s': %s", path, strerror(err));
  return LUTRA_OK;
}

int onnx_graph_write(onnx_graph *g, const char *path, const char *input_name, int ndim,
                     const int64_t *shape, const char *out, const char *output_name,
                     int64_t out_features, const char *fn) {
  /* the result under its public name */
  const char *named = out ? onnx_op1(g, "Identity", out, "output") : NULL;
  if (named) g->node[g->n_node - 1]->output[0] = dup_str(g, output_name);
  int64_t out_shape[LUTRA_MAX_DIMS];
  memcpy(out_shape, shape, (size_t)ndim * sizeof *shape);
  out_shape[ndim - 1] = out_features;
  Onnx__ValueInfoProto *in = value_info(g, input_name, ndim, shape);
  Onnx__ValueInfoProto *res = value_info(g, output_name, ndim, out_shape);
  Onnx__GraphProto *graph = alloc(g, sizeof *graph);
  Onnx__ModelProto *model = alloc(g, sizeof *model);
  Onnx__OperatorSetIdProto *opset = alloc(g, sizeof *opset);
  Onnx__ValueInfoProto **ins = alloc(g, sizeof *ins), **outs = alloc(g, sizeof *outs);
  Onnx__OperatorSetIdProto **opsets = alloc(g, sizeof *opsets);
  if (g->oom || !named || !in || !res)
    return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate the ONNX graph");
  onnx__graph_proto__init(graph);
  onnx__model_proto__init(model);
  onnx__operator_set_id_proto__init(opset);
  ins[0] = in;
  outs[0] = res;
  graph->name = "lutra";
  graph->n_node = g->n_node;
  graph->node = g->node;
  graph->n_initializer = g->n_init;
  graph->initializer = g->init;
  graph->n_input = 1;
  graph->input = ins;
  graph->n_output = 1;
  graph->output = outs;
  opset->domain = "";
  opset->has_version = 1;
  opset->version = g->opset;
  opsets[0] = opset;
  model->has_ir_version = 1;
  model->ir_version = ir_version(g->opset);
  model->n_opset_import = 1;
  model->opset_import = opsets;
  model->producer_name = "lutra";
  char version[32];
  int major, minor, patch;
  lutra_version(&major, &minor, &patch);
  snprintf(version, sizeof version, "%d.%d.%d", major, minor, patch);
  model->producer_version = version;
  model->graph = graph;
  model->n_metadata_props = g->n_meta;
  model->metadata_props = g->meta;
  size_t len = onnx__model_proto__get_packed_size(model);
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate %zu bytes for the model", len);
  onnx__model_proto__pack(model, buf);
  int st = write_file(path, buf, len, fn);
  free(buf);
  return st;
}
#endif /* LUTRA_WITH_ONNX */

/* An ONNX graph under construction (io/onnx_export.c builds one from a module tree): nodes,
 * f32/i64 initializers and metadata as the protobuf-c structs of the ONNX schema (onnx.pb-c.h,
 * generated at build time), every allocation owned by the graph and freed with it. Allocation
 * failure is sticky: the builders return NULL from then on and onnx_graph_write reports it, so
 * that the exporter checks once instead of after every node. */
#ifndef LUTRA_IO_ONNX_GRAPH_H
#define LUTRA_IO_ONNX_GRAPH_H

#include "onnx.pb-c.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct onnx_graph {
  void **allocs; /* everything below, freed by onnx_graph_free */
  size_t n_allocs, cap_allocs;
  bool oom;
  Onnx__NodeProto **node;
  size_t n_node, cap_node;
  Onnx__TensorProto **init;
  size_t n_init, cap_init;
  Onnx__StringStringEntryProto **meta;
  size_t n_meta, cap_meta;
  int64_t opset;
  int next_value; /* the number in the next intermediate value's name */
} onnx_graph;

void onnx_graph_init(onnx_graph *g, int64_t opset);
void onnx_graph_free(onnx_graph *g);

/* a node op(in[0..n_in)) -> one fresh value named after hint; the value's name, NULL on oom */
const char *onnx_op(onnx_graph *g, const char *op, int n_in, const char *const *in,
                    const char *hint);
const char *onnx_op1(onnx_graph *g, const char *op, const char *a, const char *hint);
const char *onnx_op2(onnx_graph *g, const char *op, const char *a, const char *b, const char *hint);
/* an attribute of the node that made value v (the last node) */
void onnx_attr_int(onnx_graph *g, const char *name, int64_t v);
void onnx_attr_float(onnx_graph *g, const char *name, float v);
void onnx_attr_ints(onnx_graph *g, const char *name, const int64_t *v, int n);
/* an f32 initializer named name of shape dims[0..ndim), data copied; its name */
const char *onnx_init_f32(onnx_graph *g, const char *name, int ndim, const int64_t *dims,
                          const float *data);
/* a 1-D i64 initializer (a Split's sizes, a ReduceMean's axes) and an f32 scalar; fresh names */
const char *onnx_init_i64(onnx_graph *g, const int64_t *v, int n);
const char *onnx_scalar(onnx_graph *g, float v);
void onnx_meta(onnx_graph *g, const char *key, const char *value);

/* The model: input [shape] (a dim <= 0 symbolic), the graph's result out renamed output_name with
 * the input's shape but the last dim out_features, written through a temporary beside path and
 * renamed over it. Refused (nothing written) when a builder ran out of memory. */
int onnx_graph_write(onnx_graph *g, const char *path, const char *input_name, int ndim,
                     const int64_t *shape, const char *out, const char *output_name,
                     int64_t out_features, const char *fn);

#endif

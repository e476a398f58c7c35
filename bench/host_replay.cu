/* Replay floors: the exact GPU work one lutra call issues, captured once from the stream lutra
 * runs on and issued again raw, launch by launch, from the same process (part of the library
 * that bench/host_floors.cu builds; bench/grouped_bench.lua times it against the call).
 *
 * Why a capture rather than a count of empty launches: a launch's host cost grows with what it
 * carries. lutra's grouped GEMM is a CUTLASS kernel launched with a 2-CTA cluster attribute,
 * ~200 KiB of dynamic shared memory and a parameter block of several hundred bytes; an empty
 * <<<1, 32>>> kernel carries none of that, so a floor of N empty launches understates the raw
 * cost, and a hand count of N goes stale when the code changes. A stream capture records every
 * launch as the driver received it (function, grid, block, dynamic shared memory, parameter
 * bytes, launch attributes) without running it; re-issuing those is what the call's launches
 * cost with none of lutra's own host work around them.
 *
 * What is re-issued, in dependency order (a one-stream capture is a chain; a call that forked
 * onto a second stream and joined it is a DAG, and any topological order of it issued on one
 * stream is a valid serialization):
 *   kernel nodes   cudaLaunchKernelExC of the node's CUkernel (the runtime entry point lutra's
 *                  own launches go through), or cuLaunchKernelEx where the node holds a
 *                  CUfunction or `extra` parameters (a driver-API launch), with the node's
 *                  cluster dimension, cluster scheduling policy, preferred cluster dimension,
 *                  cooperative flag and priority, and programmatic serialization where the node
 *                  waits on a programmatic (PDL) edge; then cudaGetLastError, as lutra checks
 *                  every launch
 *   memset nodes   cudaMemsetAsync / cudaMemset2DAsync (1-byte elements, what the runtime
 *                  issues), cuMemsetD16/D32(2D)Async for 2- and 4-byte ones
 *   memcpy nodes   cudaMemcpyAsync for linear copies, cuMemcpy3DAsync otherwise
 *   child graphs   cudaGraphLaunch of an instantiation of the child: what lutra did there (a
 *                  cached GEMM graph, src/backend/cuda/call_graphs.c, goes into someone
 *                  else's capture of the stream as a child graph; uncaptured, it is launched)
 *   empty, event record and event wait nodes   skipped, counted (re-recording lutra's events
 *                  would change its state; they order work, they do not do any)
 * Refused (hf_replay_end returns 1, the floor is n/a): memory allocation and free nodes (the
 * kernels' parameters would point to memory that exists only while the graph runs), host,
 * conditional, external-semaphore and batch memory-op nodes (not re-issuable raw without side
 * effects), and programmatic edges of another kind than PDL's.
 * Not in the floor: CUDA calls that leave no node (queries, attribute sets, event records that
 * only order a fork and join): host work around the launches, which is what the ratio is for.
 *
 * The capture runs nothing: the captured call's host-side state advanced (a ring of splits, an
 * amax history position) without its GPU work. Re-issued work writes the captured call's
 * addresses, i.e. lutra's live buffers, with the captured call's inputs: harmless for a timing
 * floor whose interleaved lutra calls rewrite everything they read, and the reason a capture
 * must come after warm-up calls (no buffer may be first allocated inside it).
 *
 * API (extern "C"; each returns 0, or 1 after printing the failed call to stderr):
 *   hf_replay_stream(&s)     creates (once) the replay stream, non-blocking like lutra's own,
 *                            and returns it: hand it to lutra (lutra.cuda_set_stream) so that
 *                            the call, its capture and the re-issued floor share one stream
 *   hf_replay_sync()         waits for the replay stream (nothing to do before it exists)
 *   hf_replay_begin(&s)      the same, then starts a thread-local capture on it
 *   hf_replay_end(slot)      ends the capture and records it in slot (0..7, free); a capture
 *                            that failed or holds something refused is discarded whole
 *   hf_replay_abort()        ends and discards a capture in progress (none: nothing to do)
 *   hf_replay_counts(slot, &kernels, &copies, &memsets, &graphs, &skipped)
 *   hf_replay_issue(slot, calls)   re-issues the slot's work `calls` times, without waiting
 *   hf_replay_free(slot)     waits for the stream, frees the slot
 * HF_REPLAY_LOG=1 in the environment: hf_replay_end prints each recorded kernel (name, grid,
 * block, dynamic shared memory, parameter bytes, cluster). */
#include <cuda.h>
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "host_checks.h"

/* ---- what a slot holds ---------------------------------------------------------------- */

enum OpKind { OP_KERNEL_RT, OP_KERNEL_DRV, OP_MEMSET, OP_COPY, OP_COPY3D, OP_GRAPH };

enum { MAX_ATTRS = 6, N_SLOTS = 8 };

struct Op {
  OpKind kind;
  /* kernels: the node's parameters (kernelParams point into the node: the slot keeps the
   * graph) and its launch attributes in both APIs' spelling */
  CUDA_KERNEL_NODE_PARAMS k;
  cudaLaunchAttribute rt_attrs[MAX_ATTRS];
  CUlaunchAttribute drv_attrs[MAX_ATTRS];
  unsigned n_attrs;
  CUDA_MEMSET_NODE_PARAMS set;
  CUDA_MEMCPY3D copy;
  void *dst; /* a linear copy */
  const void *src;
  size_t bytes;
  cudaGraphExec_t exec; /* a child graph's instantiation */
};

struct Slot {
  cudaGraph_t graph; /* NULL: free */
  std::vector<Op> ops;
  int64_t kernels, copies, memsets, graphs, skipped;
};

static Slot g_slots[N_SLOTS];
static cudaStream_t g_rstream;
static bool g_capturing;

static Slot *slot_at(int slot, bool want_used, const char *fn) {
  if (slot < 0 || slot >= N_SLOTS || (g_slots[slot].graph != NULL) != want_used) {
    fprintf(stderr, "host_replay: %s(%d): slot out of 0..%d or %s\n", fn, slot, N_SLOTS - 1,
            want_used ? "not recorded" : "in use (hf_replay_free it first)");
    return NULL;
  }
  return &g_slots[slot];
}

static void clear_slot(Slot &s) {
  for (Op &o : s.ops)
    if (o.exec) cudaGraphExecDestroy(o.exec);
  if (s.graph) cudaGraphDestroy(s.graph);
  s.ops.clear();
  s.graph = NULL;
  s.kernels = s.copies = s.memsets = s.graphs = s.skipped = 0;
}

/* ---- the graph's nodes in dependency order -------------------------------------------- */

static size_t index_of(const std::vector<CUgraphNode> &nodes, CUgraphNode x) {
  size_t i = 0;
  while (i < nodes.size() && nodes[i] != x)
    i++;
  return i;
}

/* order: every node after all it depends on (Kahn's algorithm: graphs of one call are tens of
 * nodes, so quadratic is fine); pdl[i]: order[i] waits on a programmatic edge */
static int topo_order(CUgraph g, std::vector<CUgraphNode> &order, std::vector<char> &pdl) {
  size_t n = 0, m = 0;
  CU(cuGraphGetNodes(g, NULL, &n));
  std::vector<CUgraphNode> nodes(n);
  if (n) CU(cuGraphGetNodes(g, nodes.data(), &n));
  CU(cuGraphGetEdges(g, NULL, NULL, NULL, &m));
  std::vector<CUgraphNode> from(m), to(m);
  std::vector<CUgraphEdgeData> data(m);
  if (m) CU(cuGraphGetEdges(g, from.data(), to.data(), data.data(), &m));
  std::vector<size_t> fi(m), ti(m), waits(n, 0);
  std::vector<char> prog(n, 0), done(n, 0);
  for (size_t e = 0; e < m; e++) {
    fi[e] = index_of(nodes, from[e]);
    ti[e] = index_of(nodes, to[e]);
    if (fi[e] == n || ti[e] == n) {
      fprintf(stderr, "host_replay: an edge of the captured graph names a node it lacks\n");
      return 1;
    }
    waits[ti[e]]++;
    if (data[e].type == CU_GRAPH_DEPENDENCY_TYPE_DEFAULT) continue;
    if (data[e].type != CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC ||
        data[e].from_port != CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC) {
      fprintf(stderr, "host_replay: a dependency of type %d from port %d is not re-issued raw\n",
              (int)data[e].type, (int)data[e].from_port);
      return 1;
    }
    prog[ti[e]] = 1;
  }
  order.clear();
  pdl.clear();
  for (size_t k = 0; k < n; k++) {
    size_t pick = 0;
    while (pick < n && (done[pick] || waits[pick]))
      pick++;
    if (pick == n) {
      fprintf(stderr, "host_replay: the captured graph has a cycle\n");
      return 1;
    }
    done[pick] = 1;
    order.push_back(nodes[pick]);
    pdl.push_back(prog[pick]);
    for (size_t e = 0; e < m; e++)
      if (fi[e] == pick) waits[ti[e]]--;
  }
  return 0;
}

/* ---- recording nodes ------------------------------------------------------------------ */

/* one attribute in both spellings (the runtime's enum values are the driver's) */
static void add_attr(Op &o, CUlaunchAttributeID id, const CUlaunchAttributeValue &v) {
  CUlaunchAttribute &d = o.drv_attrs[o.n_attrs];
  cudaLaunchAttribute &r = o.rt_attrs[o.n_attrs];
  o.n_attrs++;
  memset(&d, 0, sizeof d);
  memset(&r, 0, sizeof r);
  d.id = id;
  d.value = v;
  r.id = (cudaLaunchAttributeID)id;
  switch (id) {
  case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
    r.val.clusterDim.x = v.clusterDim.x;
    r.val.clusterDim.y = v.clusterDim.y;
    r.val.clusterDim.z = v.clusterDim.z;
    break;
  case CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION:
    r.val.preferredClusterDim.x = v.preferredClusterDim.x;
    r.val.preferredClusterDim.y = v.preferredClusterDim.y;
    r.val.preferredClusterDim.z = v.preferredClusterDim.z;
    break;
  case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
    r.val.clusterSchedulingPolicyPreference =
        (cudaClusterSchedulingPolicy)v.clusterSchedulingPolicyPreference;
    break;
  case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
    r.val.cooperative = v.cooperative;
    break;
  case CU_LAUNCH_ATTRIBUTE_PRIORITY:
    r.val.priority = v.priority;
    break;
  default: /* CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION */
    r.val.programmaticStreamSerializationAllowed = v.programmaticStreamSerializationAllowed;
  }
}

static bool more_than_one(unsigned x, unsigned y, unsigned z) {
  return (uint64_t)(x ? x : 1) * (y ? y : 1) * (z ? z : 1) > 1;
}

/* an attribute the driver may not answer for a graph node (cuGraphKernelNodeGetAttribute gave
 * CUDA_ERROR_INVALID_VALUE for the preferred cluster dimension on the H200's driver 580): zero,
 * the default, then; any other error is one */
static int optional_attr(CUgraphNode node, CUlaunchAttributeID id, CUlaunchAttributeValue *v) {
  memset(v, 0, sizeof *v);
  const CUresult r = cuGraphKernelNodeGetAttribute(node, id, v);
  if (r == CUDA_ERROR_INVALID_VALUE) {
    memset(v, 0, sizeof *v);
    return 0;
  }
  CU(r);
  return 0;
}

/* the attributes of a kernel node that change what a launch does, where they are not the
 * defaults (a launch without them is a launch with the defaults) */
static int record_attrs(CUgraphNode node, bool pdl, Op &o) {
  CUlaunchAttributeValue v;
  CU(cuGraphKernelNodeGetAttribute(node, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &v));
  if (more_than_one(v.clusterDim.x, v.clusterDim.y, v.clusterDim.z))
    add_attr(o, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, v);
  TRY(optional_attr(node, CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION, &v));
  if (more_than_one(v.preferredClusterDim.x, v.preferredClusterDim.y, v.preferredClusterDim.z))
    add_attr(o, CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION, v);
  TRY(optional_attr(node, CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE, &v));
  if (v.clusterSchedulingPolicyPreference != CU_CLUSTER_SCHEDULING_POLICY_DEFAULT)
    add_attr(o, CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE, v);
  TRY(optional_attr(node, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &v));
  if (v.cooperative) add_attr(o, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, v);
  TRY(optional_attr(node, CU_LAUNCH_ATTRIBUTE_PRIORITY, &v));
  if (v.priority) add_attr(o, CU_LAUNCH_ATTRIBUTE_PRIORITY, v);
  if (pdl) {
    memset(&v, 0, sizeof v);
    v.programmaticStreamSerializationAllowed = 1;
    add_attr(o, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, v);
  }
  return 0;
}

/* a kernel's name and parameter bytes, for HF_REPLAY_LOG only, so its queries are unchecked
 * (a failed name query prints "?"; the parameter count is found by asking for indices until
 * the driver says there is none) */
static void log_kernel(const Op &o) {
  const CUDA_KERNEL_NODE_PARAMS &k = o.k;
  const char *name = NULL;
  size_t bytes = 0, off = 0, size = 0;
  if (k.func) {
    cuFuncGetName(&name, k.func);
    for (size_t i = 0; cuFuncGetParamInfo(k.func, i, &off, &size) == CUDA_SUCCESS; i++)
      bytes = off + size;
  } else {
    cuKernelGetName(&name, k.kern);
    for (size_t i = 0; cuKernelGetParamInfo(k.kern, i, &off, &size) == CUDA_SUCCESS; i++)
      bytes = off + size;
  }
  unsigned cx = 1, cy = 1, cz = 1;
  for (unsigned i = 0; i < o.n_attrs; i++)
    if (o.drv_attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
      cx = o.drv_attrs[i].value.clusterDim.x;
      cy = o.drv_attrs[i].value.clusterDim.y;
      cz = o.drv_attrs[i].value.clusterDim.z;
    }
  fprintf(stderr,
          "host_replay:   kernel %.80s grid %ux%ux%u block %ux%ux%u smem %u params %zu bytes "
          "cluster %ux%ux%u attrs %u via %s\n",
          name ? name : "?", k.gridDimX, k.gridDimY, k.gridDimZ, k.blockDimX, k.blockDimY,
          k.blockDimZ, k.sharedMemBytes, bytes, cx, cy, cz, o.n_attrs,
          o.kind == OP_KERNEL_RT ? "runtime" : "driver");
}

static int record_kernel(CUgraphNode node, bool pdl, Op &o) {
  CU(cuGraphKernelNodeGetParams(node, &o.k));
  if (!o.k.func && !o.k.kern) {
    fprintf(stderr, "host_replay: a kernel node holds neither a CUfunction nor a CUkernel\n");
    return 1;
  }
  /* the header: kern is referenced only when func is NULL; the runtime takes a CUkernel
   * (cudaKernel_t) but neither a CUfunction nor `extra` */
  o.kind = !o.k.func && o.k.kernelParams && !o.k.extra ? OP_KERNEL_RT : OP_KERNEL_DRV;
  TRY(record_attrs(node, pdl, o));
  return 0;
}

static void *copy_end(CUmemorytype type, const void *host, CUdeviceptr dev, size_t x) {
  return (char *)(type == CU_MEMORYTYPE_HOST ? host : (const void *)(uintptr_t)dev) + x;
}

static int record_copy(CUgraphNode node, Op &o) {
  CU(cuGraphMemcpyNodeGetParams(node, &o.copy));
  const CUDA_MEMCPY3D &c = o.copy;
  bool linear = c.Height <= 1 && c.Depth <= 1 && c.srcY == 0 && c.srcZ == 0 && c.dstY == 0 &&
                c.dstZ == 0 && c.srcMemoryType != CU_MEMORYTYPE_ARRAY &&
                c.dstMemoryType != CU_MEMORYTYPE_ARRAY;
  o.kind = linear ? OP_COPY : OP_COPY3D;
  if (linear) {
    o.src = copy_end(c.srcMemoryType, c.srcHost, c.srcDevice, c.srcXInBytes);
    o.dst = copy_end(c.dstMemoryType, c.dstHost, c.dstDevice, c.dstXInBytes);
    o.bytes = c.WidthInBytes;
  }
  return 0;
}

/* The child's graph belongs to its node, which the driver refuses to instantiate as it is
 * (cudaErrorNotSupported): a clone of it is instantiated, what a graph launch of lutra's own
 * cached graph costs. */
static int record_child(CUgraphNode node, Op &o) {
  CUgraph child, copy;
  CU(cuGraphChildGraphNodeGetGraph(node, &child));
  CU(cuGraphClone(&copy, child));
  cudaError_t e = cudaGraphInstantiate(&o.exec, (cudaGraph_t)copy, 0);
  cuGraphDestroy(copy);
  if (e != cudaSuccess) {
    (void)cudaGetLastError(); /* not left for the next launch lutra checks */
    fprintf(stderr, "host_replay: a child graph could not be instantiated: %s\n",
            cudaGetErrorString(e));
    return 1;
  }
  o.kind = OP_GRAPH;
  return 0;
}

static const char *refused(CUgraphNodeType t) {
  switch (t) {
  case CU_GRAPH_NODE_TYPE_MEM_ALLOC:
  case CU_GRAPH_NODE_TYPE_MEM_FREE:
    return "a stream-ordered allocation or free (the call allocated inside the capture: warm it "
           "up first; kernels re-issued raw would address memory only a graph launch maps)";
  case CU_GRAPH_NODE_TYPE_HOST:
    return "a host function";
  case CU_GRAPH_NODE_TYPE_CONDITIONAL:
    return "a conditional node";
  default:
    return "an external-semaphore or batch memory-op node";
  }
}

/* one node into s.ops (or counted as skipped) */
static int record_node(CUgraphNode node, bool pdl, Slot &s) {
  CUgraphNodeType t;
  CU(cuGraphNodeGetType(node, &t));
  if (t == CU_GRAPH_NODE_TYPE_EMPTY || t == CU_GRAPH_NODE_TYPE_EVENT_RECORD ||
      t == CU_GRAPH_NODE_TYPE_WAIT_EVENT) {
    s.skipped++;
    return 0;
  }
  Op o;
  memset(&o, 0, sizeof o);
  switch (t) {
  case CU_GRAPH_NODE_TYPE_KERNEL:
    TRY(record_kernel(node, pdl, o));
    s.kernels++;
    break;
  case CU_GRAPH_NODE_TYPE_MEMSET:
    CU(cuGraphMemsetNodeGetParams(node, &o.set));
    o.kind = OP_MEMSET;
    s.memsets++;
    break;
  case CU_GRAPH_NODE_TYPE_MEMCPY:
    TRY(record_copy(node, o));
    s.copies++;
    break;
  case CU_GRAPH_NODE_TYPE_GRAPH:
    TRY(record_child(node, o));
    s.graphs++;
    break;
  default:
    fprintf(stderr, "host_replay: the capture holds %s, which is not re-issued raw\n", refused(t));
    return 1;
  }
  s.ops.push_back(o);
  return 0;
}

static int record(Slot &s) {
  std::vector<CUgraphNode> order;
  std::vector<char> pdl;
  TRY(topo_order((CUgraph)s.graph, order, pdl));
  s.ops.reserve(order.size());
  for (size_t i = 0; i < order.size(); i++)
    TRY(record_node(order[i], pdl[i] != 0, s));
  return 0;
}

/* ---- issuing -------------------------------------------------------------------------- */

static int issue_kernel(Op &o, cudaStream_t st) {
  const CUDA_KERNEL_NODE_PARAMS &k = o.k;
  if (o.kind == OP_KERNEL_RT) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(k.gridDimX, k.gridDimY, k.gridDimZ);
    cfg.blockDim = dim3(k.blockDimX, k.blockDimY, k.blockDimZ);
    cfg.dynamicSmemBytes = k.sharedMemBytes;
    cfg.stream = st;
    cfg.attrs = o.n_attrs ? o.rt_attrs : NULL;
    cfg.numAttrs = o.n_attrs;
    CK(cudaLaunchKernelExC(&cfg, (const void *)k.kern, k.kernelParams));
  } else {
    CUlaunchConfig cfg = {};
    cfg.gridDimX = k.gridDimX;
    cfg.gridDimY = k.gridDimY;
    cfg.gridDimZ = k.gridDimZ;
    cfg.blockDimX = k.blockDimX;
    cfg.blockDimY = k.blockDimY;
    cfg.blockDimZ = k.blockDimZ;
    cfg.sharedMemBytes = k.sharedMemBytes;
    cfg.hStream = (CUstream)st;
    cfg.attrs = o.n_attrs ? o.drv_attrs : NULL;
    cfg.numAttrs = o.n_attrs;
    /* the header: a CUkernel is launched by casting it to CUfunction */
    CU(cuLaunchKernelEx(&cfg, k.func ? k.func : (CUfunction)k.kern, k.kernelParams, k.extra));
  }
  CK(cudaGetLastError());
  return 0;
}

static int issue_memset(const CUDA_MEMSET_NODE_PARAMS &m, cudaStream_t st) {
  CUstream s = (CUstream)st;
  void *dst = (void *)(uintptr_t)m.dst;
  switch (m.elementSize * 2 + (m.height > 1)) { /* the element size, and 1-D or 2-D */
  case 2:
    CK(cudaMemsetAsync(dst, (int)m.value, m.width, st));
    break;
  case 3:
    CK(cudaMemset2DAsync(dst, m.pitch, (int)m.value, m.width, m.height, st));
    break;
  case 4:
    CU(cuMemsetD16Async(m.dst, (unsigned short)m.value, m.width, s));
    break;
  case 5:
    CU(cuMemsetD2D16Async(m.dst, m.pitch, (unsigned short)m.value, m.width, m.height, s));
    break;
  case 8:
    CU(cuMemsetD32Async(m.dst, m.value, m.width, s));
    break;
  case 9:
    CU(cuMemsetD2D32Async(m.dst, m.pitch, m.value, m.width, m.height, s));
    break;
  default:
    fprintf(stderr, "host_replay: a memset node of %u-byte elements\n", m.elementSize);
    return 1;
  }
  return 0;
}

static int issue(Op &o, cudaStream_t st) {
  switch (o.kind) {
  case OP_KERNEL_RT:
  case OP_KERNEL_DRV:
    return issue_kernel(o, st);
  case OP_MEMSET:
    return issue_memset(o.set, st);
  case OP_COPY:
    CK(cudaMemcpyAsync(o.dst, o.src, o.bytes, cudaMemcpyDefault, st));
    break;
  case OP_COPY3D:
    CU(cuMemcpy3DAsync(&o.copy, (CUstream)st));
    break;
  case OP_GRAPH:
    CK(cudaGraphLaunch(o.exec, st));
    break;
  }
  return 0;
}

/* ---- the API -------------------------------------------------------------------------- */

EXPORT int hf_replay_stream(void **stream_out) {
  if (!g_rstream) CK(cudaStreamCreateWithFlags(&g_rstream, cudaStreamNonBlocking));
  if (stream_out) *stream_out = g_rstream;
  return 0;
}

EXPORT int hf_replay_sync(void) {
  if (g_rstream) CK(cudaStreamSynchronize(g_rstream));
  return 0;
}

/* Thread-local mode, as lutra_graph_begin captures: a call this thread makes that a capture
 * cannot hold (a synchronization, a pageable copy, cudaMalloc) fails and invalidates the
 * capture, so the floor is refused instead of silently leaving that work out (relaxed mode
 * would let some of it run eagerly, outside the graph); another thread's calls are not this
 * capture's business (global mode would let them invalidate it). */
EXPORT int hf_replay_begin(void **stream_out) {
  if (g_capturing) {
    fprintf(stderr, "host_replay: hf_replay_begin: a capture is in progress already\n");
    return 1;
  }
  TRY(hf_replay_stream(stream_out));
  CK(cudaStreamBeginCapture(g_rstream, cudaStreamCaptureModeThreadLocal));
  g_capturing = true;
  return 0;
}

EXPORT int hf_replay_abort(void) {
  if (!g_capturing) return 0;
  g_capturing = false;
  cudaGraph_t graph = NULL;
  if (cudaStreamEndCapture(g_rstream, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
  (void)cudaGetLastError(); /* an invalidated capture leaves its error behind */
  return 0;
}

static void print_counts(int slot, const Slot &s) {
  fprintf(stderr,
          "host_replay: slot %d: %lld kernels, %lld copies, %lld memsets, %lld graph launches, "
          "%lld nodes skipped\n",
          slot, (long long)s.kernels, (long long)s.copies, (long long)s.memsets,
          (long long)s.graphs, (long long)s.skipped);
  if (!getenv("HF_REPLAY_LOG") || strcmp(getenv("HF_REPLAY_LOG"), "1") != 0) return;
  for (const Op &o : s.ops)
    if (o.kind == OP_KERNEL_RT || o.kind == OP_KERNEL_DRV) log_kernel(o);
}

EXPORT int hf_replay_end(int slot) {
  if (!g_capturing) {
    fprintf(stderr, "host_replay: hf_replay_end: no capture in progress\n");
    return 1;
  }
  g_capturing = false;
  cudaGraph_t graph = NULL;
  cudaError_t e = cudaStreamEndCapture(g_rstream, &graph);
  if (e != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    fprintf(stderr,
            "host_replay: cudaStreamEndCapture failed: %s (%s): the call made a CUDA call a "
            "capture cannot hold (a synchronization, a host copy, an allocation)\n",
            cudaGetErrorString(e), cudaGetErrorName(e));
    return 1;
  }
  Slot *s = slot_at(slot, false, "hf_replay_end");
  if (!s || !graph) {
    if (graph) cudaGraphDestroy(graph);
    if (!graph) fprintf(stderr, "host_replay: hf_replay_end: the capture returned no graph\n");
    return 1;
  }
  s->graph = graph;
  if (record(*s) != 0) {
    clear_slot(*s);
    return 1;
  }
  print_counts(slot, *s);
  return 0;
}

EXPORT int hf_replay_counts(int slot, int64_t *kernels, int64_t *copies, int64_t *memsets,
                            int64_t *graphs, int64_t *skipped) {
  const Slot *s = slot_at(slot, true, "hf_replay_counts");
  if (!s) return 1;
  if (kernels) *kernels = s->kernels;
  if (copies) *copies = s->copies;
  if (memsets) *memsets = s->memsets;
  if (graphs) *graphs = s->graphs;
  if (skipped) *skipped = s->skipped;
  return 0;
}

EXPORT int hf_replay_issue(int slot, int calls) {
  Slot *s = slot_at(slot, true, "hf_replay_issue");
  if (!s) return 1;
  for (int c = 0; c < calls; c++)
    for (Op &o : s->ops)
      TRY(issue(o, g_rstream));
  return 0;
}

/* waits first: a child graph's instantiation must not be destroyed while it may run */
EXPORT int hf_replay_free(int slot) {
  Slot *s = slot_at(slot, true, "hf_replay_free");
  if (!s) return 1;
  CK(cudaStreamSynchronize(g_rstream));
  clear_slot(*s);
  return 0;
}

/* CUDA graphs: stream capture of lutra's stream, in thread-local mode (another thread's
 * unsafe CUDA calls are not this capture's business), instantiated once, launched per replay. */
#include "cuda_backend.h"

int lutra_cuda_capture_begin(void) {
  return lutra_cuda_status(
      cudaStreamBeginCapture(lutra_cuda_stream(), cudaStreamCaptureModeThreadLocal),
      "lutra_graph_begin", "cudaStreamBeginCapture");
}

int lutra_cuda_capture_end(void **exec, int64_t *nodes) {
  static const char fn[] = "lutra_graph_end";
  cudaGraph_t graph = NULL;
  cudaError_t ended = cudaStreamEndCapture(lutra_cuda_stream(), &graph);
  lutra_cuda_free_deferred();
  TRY(lutra_cuda_status(ended, fn,
                        "cudaStreamEndCapture (the capture was invalidated by a call it cannot "
                        "contain)"));
  size_t count = 0;
  cudaError_t e = cudaGraphGetNodes(graph, NULL, &count);
  cudaGraphExec_t x = NULL;
  if (e == cudaSuccess) e = cudaGraphInstantiate(&x, graph, 0);
  cudaGraphDestroy(graph); /* the executable graph does not need it */
  TRY(lutra_cuda_status(e, fn, "cudaGraphInstantiate"));
  *exec = x;
  *nodes = (int64_t)count;
  return LUTRA_OK;
}

void lutra_cuda_capture_abort(void) {
  cudaGraph_t graph = NULL;
  if (cudaStreamEndCapture(lutra_cuda_stream(), &graph) == cudaSuccess && graph)
    cudaGraphDestroy(graph);
  lutra_cuda_free_deferred();
  (void)cudaGetLastError(); /* an invalidated capture leaves its error behind */
}

int lutra_cuda_graph_launch(void *exec) {
  return lutra_cuda_status(cudaGraphLaunch((cudaGraphExec_t)exec, lutra_cuda_stream()),
                           "lutra_graph_replay", "cudaGraphLaunch");
}

void lutra_cuda_graph_destroy(void *exec) {
  if (exec) cudaGraphExecDestroy((cudaGraphExec_t)exec);
}

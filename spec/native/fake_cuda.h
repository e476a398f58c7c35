/* The names src/backend/cuda/call_graphs.c takes from the CUDA runtime and from the rest of the
 * CUDA backend, renamed onto the fakes spec/native/check_call_graphs.c defines. The check builds
 * the real call_graphs.c with this header forced in first (-include), so the cache's calls reach
 * the fake runtime while no file outside src/ defines a CUDA runtime or lutra backend name.
 * Coming before every other header, the renames also apply to the real declarations
 * (cuda_runtime_api.h, backend/cuda/cuda_backend.h, core/capture.h): a fake whose signature
 * strays from the one call_graphs.c is written against does not compile. */
#ifndef LUTRA_SPEC_FAKE_CUDA_H
#define LUTRA_SPEC_FAKE_CUDA_H

/* the CUDA runtime */
#define cudaGetLastError                    fake_cudaGetLastError
#define cudaGraphAddChildGraphNode          fake_cudaGraphAddChildGraphNode
#define cudaGraphDestroy                    fake_cudaGraphDestroy
#define cudaGraphExecDestroy                fake_cudaGraphExecDestroy
#define cudaGraphInstantiate                fake_cudaGraphInstantiate
#define cudaGraphLaunch                     fake_cudaGraphLaunch
#define cudaStreamBeginCapture              fake_cudaStreamBeginCapture
#define cudaStreamEndCapture                fake_cudaStreamEndCapture
#define cudaStreamGetCaptureInfo            fake_cudaStreamGetCaptureInfo
#define cudaStreamIsCapturing               fake_cudaStreamIsCapturing
#define cudaStreamUpdateCaptureDependencies fake_cudaStreamUpdateCaptureDependencies

/* the rest of the backend (context_cuda.c) and the capture flag (runtime/graph.c) */
#define lutra_cuda_status         fake_lutra_cuda_status
#define lutra_cuda_stream         fake_lutra_cuda_stream
#define lutra_cuda_stream_private fake_lutra_cuda_stream_private
#define lutra_capture_active      fake_lutra_capture_active

#endif

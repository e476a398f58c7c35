/* lutra/determinism.h: one switch for bitwise-reproducible training.
 * Part of lutra.h (include that one; its conventions hold here).
 *
 * Under the switch the same seeds give the same bits of every tensor run after run, on the same
 * backend, device model, library versions and thread count of the host's own code:
 *   cpu   GEMMs run on one OpenBLAS thread (its results depend on its thread count: it splits
 *         some shapes' sums differently); lutra_cpu_set_threads(n != 1) is refused while on.
 *         Every other CPU kernel is single-threaded and ordered already.
 *   cuda  cuBLASLt algorithms are the heuristic's first choice among those that compute each
 *         dot product in one sequence (no split-K reduction), for a workspace of fixed size;
 *         cuDNN attention's backward is its deterministic algorithm (LUTRA_CUDNN_DETERMINISTIC=0
 *         is ignored), and a shape cuDNN has none for is refused by the backward, naming it.
 *         lutra's own kernels use no float atomics (integer counters and atomic maxima only,
 *         whose results do not depend on order) and reduce in fixed orders, switch or not.
 * What it costs: on the cpu, the GEMM threads beyond one; on cuda, split-K GEMMs (faster for
 * small outputs with long sums, e.g. weight gradients of narrow layers) and the attention
 * backward's dP workspace (b * h * s_q * s_kv * 2 bytes, shared per device and stream).
 * LUTRA_DETERMINISTIC in the environment at load turns it on (any value but empty or "0").
 * Plans made before a change stay cached but are not used under the other setting (the switch
 * is part of their keys). Collectives (NCCL, MPI) are outside it. */
#ifndef LUTRA_DETERMINISM_H
#define LUTRA_DETERMINISM_H

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* on: 1 or 0; refused (changing nothing) for another value or inside a graph capture */
LUTRA_API int lutra_set_deterministic(int on);
/* 1 when the switch is on, else 0 */
LUTRA_API int lutra_deterministic(void);

#ifdef __cplusplus
}
#endif
#endif /* LUTRA_DETERMINISM_H */

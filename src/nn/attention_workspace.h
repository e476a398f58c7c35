/* DotProductAttention's workspace, shared (nn/attention_workspace.c): one buffer per thread,
 * device and stream, the size of the largest plan seen there, instead of one per module and
 * plan. cuDNN's deterministic backward asks for a dP workspace of b * h * s_q * s_kv * 2 bytes
 * (400 MB a layer at GPT-2 124M with b 16, s 1024): a 12-layer model now holds one of those, not
 * 12. A workspace is scratch within one call, so the modules that run one after another on a
 * stream share it safely; a second stream (or thread) runs at the same time and gets its own. */
#ifndef LUTRA_NN_ATTENTION_WORKSPACE_H
#define LUTRA_NN_ATTENTION_WORKSPACE_H

#include "backend/backend.h"

/* *out = the calling thread's workspace for the device and its current stream, at least bytes
 * (NULL when bytes is 0), grown when smaller: a new buffer, the old one dropped (a graph
 * captured with it refuses to replay). Growing is refused inside a capture. A call's pointer is
 * good until the next call asks for more. Nothing changes on failure. */
int attention_workspace_get(const lutra_backend *be, int device, int64_t bytes, lutra_tensor **out,
                            const char *fn);

#endif

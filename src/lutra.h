/* lutra: FP8/BF16 training of linear layers, scripted from LuaJIT.
 *
 * The public header: include this one. It gathers the headers in src/lutra/, one header per concern
 * (installed as include/lutra.h and include/lutra/). LuaJIT's cdef (lua/lutra/cdef.lua) is
 * generated from it by running the preprocessor with LUTRA_CDEF defined, so everything below
 * the system includes must be plain C declarations that LuaJIT's FFI parser accepts (no inline
 * functions, no macros that Lua needs: constants are enums).
 *
 * Conventions
 * - Every entry point returns an int status: LUTRA_OK (0) or a LUTRA_E* code. On failure
 *   lutra_last_error() returns a thread-local message "call: reason", and every object
 *   passed in is left as it was.
 * - Lifetimes, two verbs for every object: lutra_X_unref(x) drops the caller's reference (the
 *   one lutra_X_new or any call handing out a new object gave, or one lutra_X_retain took);
 *   the object goes when its last holder lets go (a Sequential, optimizer, autocast scope or
 *   captured graph may hold one too). lutra_X_destroy(x) frees its buffers now and keeps the
 *   shell, marked freed, so that later calls report "was freed" instead of touching freed
 *   memory; the shell goes at the last unref. Objects another object owns (a module's output
 *   tensors and quantizers) are refused by both unless retained (unref only). The Lua front
 *   calls destroy from obj:destroy() and unref from the garbage collector. The 0.1 names
 *   (lutra_X_free, lutra_X_release) remain until 0.3 in lutra/deprecated.h.
 * - Matrices are row-major. A tensor with more than two dims is used as a matrix of
 *   shape [product of leading dims, last dim].
 */
#ifndef LUTRA_H
#define LUTRA_H

#include "lutra/attention.h"
#include "lutra/autocast.h"
#include "lutra/base.h"
#include "lutra/fused.h"
#include "lutra/checkpoint.h"
#include "lutra/determinism.h"
#include "lutra/dist.h"
#include "lutra/embedding.h"
#include "lutra/factory.h"
#include "lutra/formats.h"
#include "lutra/gemm.h"
#include "lutra/graph.h"
#include "lutra/inspect.h"
#include "lutra/moe.h"
#include "lutra/grouped.h"
#include "lutra/moe_mlp.h"
#include "lutra/nn.h"
#include "lutra/nvfp4.h"
#include "lutra/onnx.h"
#include "lutra/quantizer.h"
#include "lutra/recipe.h"
#include "lutra/recipe_options.h"
#include "lutra/rope.h"
#include "lutra/transformer.h"
#include "lutra/rules.h"
#include "lutra/tensor.h"
#include "lutra/tensor_ops.h"
#include "lutra/train.h"
#include "lutra/wrap.h"
#include "lutra/version.h"
#include "lutra/tp_modules.h"
#include "lutra/grouped_graphs.h"
#include "lutra/deprecated.h"

#endif

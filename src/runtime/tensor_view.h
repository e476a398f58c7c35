/* Views (lutra/tensor_ops.h): a view reads its base's buffer and holds a reference to the base;
 * the base counts its live views and keeps its buffers while one lives. */
#ifndef LUTRA_RUNTIME_TENSOR_VIEW_H
#define LUTRA_RUNTIME_TENSOR_VIEW_H

#include "lutra.h"

/* Drops a view's hold on base b (one view fewer, one reference fewer): a base freed while views
 * lived kept its buffers, which go with its last view. */
void lutra_tensor_view_release(lutra_tensor *b);

#endif

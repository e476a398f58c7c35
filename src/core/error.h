/* Status and the thread-local last error: every entry point reports through these. */
#ifndef LUTRA_CORE_ERROR_H
#define LUTRA_CORE_ERROR_H

#include "lutra.h"

/* Sets the thread-local last error to "fn: <formatted reason>" and returns status. */
int lutra_error(int status, const char *fn, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Re-raises the current error under the entry point fn: "fn: <the inner message>". */
int lutra_error_wrap(int status, const char *fn);

/* Argument checks: each returns from the calling entry point with a status and a message
 * naming it. They rely on a local `static const char fn[]` naming the entry point. */
#define CHECK_ARG(cond, ...)                                                                       \
  do {                                                                                             \
    if (!(cond)) return lutra_error(LUTRA_EINVAL, fn, __VA_ARGS__);                                \
  } while (0)
#define CHECK_STATE(cond, ...)                                                                     \
  do {                                                                                             \
    if (!(cond)) return lutra_error(LUTRA_ESTATE, fn, __VA_ARGS__);                                \
  } while (0)
#define TRY(expr)                                                                                  \
  do {                                                                                             \
    int st_ = (expr);                                                                              \
    if (st_ != LUTRA_OK) return st_;                                                               \
  } while (0)

#endif

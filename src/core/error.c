/* The thread-local last error, status names and the version. */
#include "core/error.h"
#include "lutra/version.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[512];

int lutra_error(int status, const char *fn, const char *fmt, ...) {
  int n = snprintf(last_error, sizeof last_error, "%s: ", fn);
  if (n < 0 || (size_t)n >= sizeof last_error) return status;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error + n, sizeof last_error - (size_t)n, fmt, ap);
  va_end(ap);
  return status;
}

const char *lutra_last_error(void) {
  return last_error;
}

int lutra_error_wrap(int status, const char *fn) {
  char inner[sizeof last_error];
  memcpy(inner, last_error, sizeof inner);
  return lutra_error(status, fn, "%s", inner);
}

const char *lutra_status_name(int status) {
  switch (status) {
  case LUTRA_OK:
    return "ok";
  case LUTRA_EINVAL:
    return "invalid argument";
  case LUTRA_ESTATE:
    return "invalid state";
  case LUTRA_ENOMEM:
    return "out of memory";
  case LUTRA_EUNSUPPORTED:
    return "unsupported";
  case LUTRA_EBACKEND:
    return "backend failure";
  case LUTRA_RULES_PENDING:
    return "scaling rules pending";
  default:
    return "unknown status";
  }
}

int lutra_version(int *major, int *minor, int *patch) {
  static const char fn[] = "lutra_version";
  CHECK_ARG(major && minor && patch, "output pointers must not be NULL");
  *major = LUTRA_VERSION_MAJOR;
  *minor = LUTRA_VERSION_MINOR;
  *patch = LUTRA_VERSION_PATCH;
  return LUTRA_OK;
}

/* External scaling rules on the CPU backend (lutra_backend.rules_gather / rules_apply). */
#include "backend/cpu/cpu.h"
#include "core/error.h"

#include <math.h>
#include <string.h>

static int check_metas(lutra_scale_meta *const *metas, int n, const void *other, const char *fn) {
  CHECK_ARG(n >= 0, "negative count %d", n);
  CHECK_ARG(n == 0 || (metas && other), "metas or the host buffer is NULL");
  for (int j = 0; j < n; j++) {
    const lutra_scale_meta *m = metas[j];
    CHECK_ARG(m && m->scale && m->scale_inv && m->amax_history && m->history_len >= 1,
              "meta %d is NULL or has no buffers", j);
  }
  return LUTRA_OK;
}

/* The copy, then lutra_cpu_delayed_update's roll. */
int lutra_cpu_rules_gather(lutra_scale_meta *const *metas, int n, float *host) {
  static const char fn[] = "lutra_cpu_rules_gather";
  TRY(check_metas(metas, n, host, fn));
  for (int j = 0; j < n; j++) {
    lutra_scale_meta *m = metas[j];
    float *h = m->amax_history;
    const int32_t len = m->history_len;
    host[0] = *m->scale;
    memcpy(host + 1, h, (size_t)len * sizeof(float));
    host += 1 + len;
    const float last = h[0];
    memmove(h, h + 1, (size_t)(len - 1) * sizeof(float));
    h[len - 1] = last;
    h[0] = 0.0f;
  }
  return LUTRA_OK;
}

int lutra_cpu_rules_apply(lutra_scale_meta *const *metas, int n, const float *scales) {
  static const char fn[] = "lutra_cpu_rules_apply";
  TRY(check_metas(metas, n, scales, fn));
  for (int j = 0; j < n; j++)
    CHECK_ARG(isfinite(scales[j]) && scales[j] > 0.0f, "scale %d is not finite and positive", j);
  for (int j = 0; j < n; j++) {
    *metas[j]->scale = scales[j];
    *metas[j]->scale_inv = 1.0f / scales[j];
  }
  return LUTRA_OK;
}

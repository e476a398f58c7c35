/* MSE and softmax cross-entropy on the CPU: the references of kernels/loss.cu. f32 element
 * math, the means accumulated in double and rounded once. */
#include "cpu.h"

#include <math.h>

/* ---- losses ---------------------------------------------------------------------------- */

int lutra_cpu_mse(const lutra_loss_args *a) {
  static const char fn[] = "lutra_cpu_mse";
  CHECK_ARG(a != NULL, "arguments are NULL");
  const void *pred = a->pred, *target = a->target;
  const int dtype = a->dtype;
  const int64_t n = a->n;
  float *loss = a->loss;
  void *dpred = a->dgrad;
  CHECK_FLOAT_DTYPE(dtype, "pred");
  CHECK_ARG(n > 0, "element count must be positive (got %lld)", (long long)n);
  CHECK_ARG(pred && target && loss, "pred, target and loss must not be NULL");
  double sum = 0.0;
  const float scale = 2.0f / (float)n;
  for (int64_t i = 0; i < n; i++) {
    float diff = lutra_elem_load(pred, dtype, i) - lutra_elem_load(target, dtype, i);
    sum += (double)diff * (double)diff;
    if (dpred) lutra_elem_store(dpred, dtype, i, scale * diff);
  }
  *loss = (float)(sum / (double)n);
  return LUTRA_OK;
}

int lutra_cpu_softmax_xent(const lutra_loss_args *a) {
  static const char fn[] = "lutra_cpu_softmax_xent";
  CHECK_ARG(a != NULL, "arguments are NULL");
  const void *logits = a->pred;
  const int32_t *labels = a->labels;
  const int dtype = a->dtype;
  const int64_t rows = a->rows, cols = a->cols;
  float *loss = a->loss;
  void *dlogits = a->dgrad;
  CHECK_FLOAT_DTYPE(dtype, "logits");
  CHECK_ARG(rows > 0 && cols > 0, "shape must be positive (got [%lld, %lld])", (long long)rows,
            (long long)cols);
  CHECK_ARG(logits && labels && loss, "logits, labels and loss must not be NULL");
  for (int64_t r = 0; r < rows; r++)
    CHECK_ARG(labels[r] >= 0 && labels[r] < cols, "label %d at row %lld is out of range [0, %lld)",
              (int)labels[r], (long long)r, (long long)cols);
  double total = 0.0;
  const float inv_rows = 1.0f / (float)rows;
  for (int64_t r = 0; r < rows; r++) {
    int64_t base = r * cols;
    float mx = -INFINITY;
    for (int64_t j = 0; j < cols; j++) {
      float v = lutra_elem_load(logits, dtype, base + j);
      if (v > mx) mx = v;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < cols; j++)
      sum += (double)expf(lutra_elem_load(logits, dtype, base + j) - mx);
    float log_sum = (float)log(sum);
    float target = lutra_elem_load(logits, dtype, base + labels[r]); /* before dlogits is written */
    total += (double)(mx - target) + (double)log_sum;
    if (dlogits) {
      float inv_sum = (float)(1.0 / sum);
      for (int64_t j = 0; j < cols; j++) {
        float p = expf(lutra_elem_load(logits, dtype, base + j) - mx) * inv_sum;
        if (j == labels[r]) p -= 1.0f;
        lutra_elem_store(dlogits, dtype, base + j, p * inv_rows);
      }
    }
  }
  *loss = (float)(total / (double)rows);
  return LUTRA_OK;
}

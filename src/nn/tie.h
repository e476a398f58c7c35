/* Weight tying (lutra_linear_desc.tie, lutra/nn.h): modules that share one parameter (its value,
 * gradient and main grad tensors: one buffer each) and the state they keep together, which lives
 * in the module owning the tensors and is reached through lutra_module_ops.tie.
 *
 * The gradient rule, the same for every module whether it shares a parameter or not: a backward
 * overwrites the gradient, unless another module sharing it wrote it since this module's last
 * forward; then it adds. A step whose forwards all run before its backwards (every model's
 * forward-then-backward) thus leaves the sum of every sharer's part, whichever order the
 * backwards run (GPT's LM head first, its embedding last), and the next step's first backward
 * starts afresh: nothing to zero, nothing to get wrong. A module alone, or a second backward of
 * the same forward, overwrites as before. With accumulate_main_grad every backward adds into the
 * shared f32 main_grad (as it does untied), and zero_grad or the user clears it.
 * The decision is made on the host when the backward is issued, from the order of the calls: a
 * CUDA graph captures it with the launches, and every replay of the same sequence repeats it.
 * Counters and a pointer, no allocation: the hot path pays a few stores per call. */
#ifndef LUTRA_NN_TIE_H
#define LUTRA_NN_TIE_H

#include <stdbool.h>
#include <stdint.h>

typedef struct lutra_tie {
  uint64_t clock;      /* the sharers' forwards and gradient writes, counted */
  uint64_t written_at; /* the clock at the last backward that wrote the gradient */
  const void *writer;  /* that backward's module (its own tie stamp's address) */
  int32_t tied;        /* modules using the parameter besides its owner (tied Linears) */
  int32_t writes;      /* backwards that wrote this step's gradient (the first overwrote) */
} lutra_tie;

/* A forward that a backward will follow: the stamp the module keeps for its backward. */
static inline uint64_t lutra_tie_forward(lutra_tie *t) {
  return ++t->clock;
}

/* A backward of the module whose stamp is at *forward_at, about to write the gradient: whether
 * it adds (another sharer wrote it since that forward) rather than overwrites. */
static inline bool lutra_tie_adds(const lutra_tie *t, const uint64_t *forward_at) {
  return t->writer && t->writer != forward_at && t->written_at > *forward_at;
}

/* That backward wrote the gradient, adding as lutra_tie_adds said (recorded once it succeeded: a
 * failed one leaves the tie as it was, and the next sharer's backward overwrites). Whether the
 * gradient is final: every module using the parameter wrote its part, so a data-parallel sync
 * may start on it (lutra_dist_grad_ready); before that, an early all-reduce would miss the
 * later parts (a sharer that runs no backward: the sync's finish starts the bucket then). */
static inline bool lutra_tie_wrote(lutra_tie *t, const uint64_t *forward_at, bool added) {
  t->written_at = ++t->clock;
  t->writer = forward_at;
  t->writes = added ? t->writes + 1 : 1;
  return t->writes > t->tied;
}

#endif

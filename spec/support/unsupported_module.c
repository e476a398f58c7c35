/* For spec/checkpoint_modules_spec.lua only: relabels a module as a kind with no checkpoint
 * entry (every kind lutra ships has one), so that the spec can show what lutra_checkpoint_save
 * does with the next kind that forgets it. Built with -Isrc against the module protocol. */
#include "nn/module.h"

static lutra_module_ops unsupported_ops;

int unsupported_module_relabel(lutra_module *m) {
  unsupported_ops = *m->ops;
  unsupported_ops.kind = "spec_unsupported_kind";
  unsupported_ops.checkpoint = NULL;
  m->ops = &unsupported_ops;
  return 0;
}

/* The temporary file a checkpoint save writes before renaming it over the destination. */
#ifndef LUTRA_IO_CHECKPOINT_TEMP_H
#define LUTRA_IO_CHECKPOINT_TEMP_H

/* A new file ".NAME.tmp.PID.N" beside path (N counts this process's saves), opened for writing
 * with the mode a plain fopen would give it; its name malloc'ed into *tmp. Returns the fd, or -1
 * with the error set. Before that, the temporaries of the same destination left by processes
 * that are gone (a save killed or crashed half-way) are removed: see ckpt_remove_stale_temps. */
int ckpt_create_temp(const char *path, char **tmp, const char *fn);
/* Removes ".NAME.tmp.PID.N" files beside path whose PID is no live process of this machine (kill
 * answers ESRCH, or /proc says it is a zombie). Never this process's own (another thread may be
 * saving) nor a live one's; a PID reused by another live process keeps its file until that one is
 * gone too. The PIDs are this machine's: a directory shared with saves running on other hosts must
 * not rely on it. */
void ckpt_remove_stale_temps(const char *path);

#endif

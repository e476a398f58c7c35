/* Temporary files of checkpoint saves (io/checkpoint_temp.h). */
#include "io/checkpoint_temp.h"
#include "core/error.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* s is "DIGITS" (1 to 19 of them) followed by stop: its value, else -1 */
static long long number_until(const char **s, char stop) {
  const char *p = *s;
  long long v = 0;
  int n = 0;
  for (; *p >= '0' && *p <= '9'; p++, n++) {
    if (n == 18) return -1;
    v = v * 10 + (*p - '0');
  }
  if (n == 0 || *p != stop) return -1;
  *s = p + (stop != 0);
  return v;
}

/* The PID of a temporary of the file `base` named entry (".BASE.tmp.PID.N"), else -1. */
static long long temp_pid(const char *entry, const char *base) {
  size_t b = strlen(base);
  if (entry[0] != '.' || strncmp(entry + 1, base, b) != 0 || strncmp(entry + 1 + b, ".tmp.", 5))
    return -1;
  const char *p = entry + 1 + b + 5;
  long long pid = number_until(&p, '.');
  if (pid <= 0 || number_until(&p, 0) < 0) return -1;
  return pid;
}

/* No process pid can write any more: none (kill says ESRCH; EPERM is a live process of another
 * user), or a zombie (dead, not yet reaped by its parent; Linux's /proc says so). */
static bool process_gone(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  char stat[64], buf[256];
  snprintf(stat, sizeof stat, "/proc/%ld/stat", (long)pid);
  FILE *f = fopen(stat, "r");
  if (!f) return false;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  /* "pid (comm) S ...": the state follows the last ')' (comm may hold one) */
  const char *close = strrchr(buf, ')');
  return close && close[1] == ' ' && close[2] == 'Z';
}

void ckpt_remove_stale_temps(const char *path) {
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  size_t dlen = slash ? (size_t)(slash - path) + 1 : 0;
  char *dir = malloc(dlen + 2);
  if (!dir) return; /* best effort: a leftover is no error of this save */
  if (dlen)
    memcpy(dir, path, dlen), dir[dlen] = 0;
  else
    strcpy(dir, ".");
  DIR *d = opendir(dir);
  free(dir);
  if (!d) return;
  const long long self = (long long)getpid();
  struct dirent *ent;
  while ((ent = readdir(d)) != NULL) {
    long long pid = temp_pid(ent->d_name, base);
    if (pid <= 0 || pid == self || pid != (long long)(pid_t)pid) continue;
    if (!process_gone((pid_t)pid)) continue;
    unlinkat(dirfd(d), ent->d_name, 0);
  }
  closedir(d);
}

int ckpt_create_temp(const char *path, char **tmp, const char *fn) {
  static _Atomic unsigned counter;
  ckpt_remove_stale_temps(path);
  const char *slash = strrchr(path, '/');
  size_t dir = slash ? (size_t)(slash - path + 1) : 0;
  size_t n = strlen(path) + 48;
  *tmp = malloc(n);
  if (!*tmp) {
    lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a path");
    return -1;
  }
  for (int attempt = 0; attempt < 100; attempt++) {
    snprintf(*tmp, n, "%.*s.%s.tmp.%ld.%u", (int)dir, path, path + dir, (long)getpid(), counter++);
    /* 0666 less the umask: mkstemp's 0600 would become the checkpoint's mode */
    int fd = open(*tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0 || errno != EEXIST) {
      if (fd < 0) lutra_error(LUTRA_EINVAL, fn, "cannot create '%s': %s", *tmp, strerror(errno));
      return fd;
    }
  }
  lutra_error(LUTRA_EINVAL, fn, "cannot create a temporary file beside '%s'", path);
  return -1;
}

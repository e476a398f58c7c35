/* Built by spec/install_spec.lua against an installed lutra with
 * `cc $(pkg-config --cflags --libs lutra)`: the installed headers compile as C11 with every
 * warning an error, the installed library links and runs, and both are the same version.
 * Prints one "ok ..." line per check, "FAIL ..." otherwise; exits 1 on any failure. */
#include <lutra.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

static int failures;

static void check(int cond, const char *what) {
  printf("%s %s\n", cond ? "ok" : "FAIL", what);
  if (!cond) failures++;
}

int main(void) {
  int major = -1, minor = -1, patch = -1;
  check(lutra_version(&major, &minor, &patch) == LUTRA_OK, "lutra_version returns LUTRA_OK");
  check(major == LUTRA_VERSION_MAJOR && minor == LUTRA_VERSION_MINOR &&
            patch == LUTRA_VERSION_PATCH,
        "the library's version is the header's");
  printf("version %d.%d.%d\n", major, minor, patch);

  /* a fill through the library, read back and reduced here */
  enum { N = 257 };
  int64_t shape[1] = {N};
  lutra_tensor *t = NULL;
  check(lutra_tensor_new(LUTRA_F32, 1, shape, LUTRA_CPU, &t) == LUTRA_OK, "lutra_tensor_new");
  check(lutra_tensor_randn(t, 12345, 0.0f, 1.0f) == LUTRA_OK, "lutra_tensor_randn");
  float values[N], amax = -1.0f, mine = 0.0f;
  for (int i = 0; i < N; i++) values[i] = NAN;
  check(lutra_tensor_get_f32(t, values, N) == LUTRA_OK, "lutra_tensor_get_f32");
  check(lutra_tensor_amax(t, &amax) == LUTRA_OK, "lutra_tensor_amax");
  for (int i = 0; i < N; i++) mine = fmaxf(mine, fabsf(values[i]));
  check(mine > 0.0f && amax == mine, "the library's amax is the amax of the values it wrote");
  check(lutra_tensor_unref(t) == LUTRA_OK, "lutra_tensor_unref");

  /* a refused call: status and the last error naming the call */
  int64_t bad[1] = {-3};
  lutra_tensor *none = NULL;
  check(lutra_tensor_new(LUTRA_F32, 1, bad, LUTRA_CPU, &none) == LUTRA_EINVAL && none == NULL,
        "a negative dim is LUTRA_EINVAL");
  check(strncmp(lutra_last_error(), "lutra_tensor_new: ", 18) == 0,
        "the last error names lutra_tensor_new");

  printf("installed_check: %d failures\n", failures);
  return failures ? 1 : 0;
}

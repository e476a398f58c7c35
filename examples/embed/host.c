/* A C host that embeds LuaJIT and runs a Lua training script every frame against buffers it
 * owns: how an engine with a Lua scripting layer trains a model in its frame loop.
 *
 *   make examples/embed/host && ./examples/embed/host [frames] [script]
 *
 * (LUA_PATH must let the script find lutra: the build tree's lua/?.lua;lua/?/init.lua, or the
 * installed tree's share/lua/5.1.) The host owns its observations and targets (a sensor-like
 * signal and a function of it) and writes them in place each frame: the two lutra tensors it
 * hands the script once are lutra_tensor_wrap views of those arrays, so no frame copies them
 * (lutra reads the host's memory; the host keeps it alive past the tensors). The script
 * (examples/embed/train_step.lua, loaded with luaL_dofile) runs one step per frame under
 * lua_pcall. Lua and the host share one liblutra: the Lua front takes the copy this executable
 * is linked with.
 *
 * On one frame the host makes the script fail inside its autocast scope. lua_pcall returns the
 * error; the host then exits every scope the script left entered (lutra_autocast_unwind to the
 * depth it saved before the call: the failed step's amaxes are dropped, not folded into the next
 * scale update), logs the error and goes on training. It exits 1 if the recovery left a scope
 * entered or the loss did not fall to a fifth of its start. */
#include <lutra.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { ROWS = 128, WIDTH = 16 };

/* the host's own buffers */
static float observations[ROWS * WIDTH], wanted[ROWS * WIDTH];

static uint32_t rng = 99u;
static float uniform(float lo, float hi) {
  rng = rng * 1664525u + 1013904223u;
  return lo + (hi - lo) * (float)(rng >> 8) / 16777216.0f;
}

/* this frame's data: the target is a fixed nonlinear function of the observation */
static void sense(void) {
  for (int r = 0; r < ROWS; r++) {
    float *o = observations + r * WIDTH, *w = wanted + r * WIDTH;
    for (int c = 0; c < WIDTH; c++) o[c] = uniform(-1.0f, 1.0f);
    for (int c = 0; c < WIDTH; c++) w[c] = sinf(2.0f * o[c]) * o[(c + 1) % WIDTH];
  }
}

#define CK(call)                                                                                   \
  do {                                                                                             \
    if ((call) != LUTRA_OK) {                                                                      \
      fprintf(stderr, "host: %s failed: %s\n", #call, lutra_last_error());                         \
      return 2;                                                                                    \
    }                                                                                              \
  } while (0)

/* pushes script[name] (the script's table is at index 1) */
static void push_function(lua_State *L, const char *name) { lua_getfield(L, 1, name); }

int main(int argc, char **argv) {
  long frames = argc > 1 ? atol(argv[1]) : 300;
  const char *script = argc > 2 ? argv[2] : "examples/embed/train_step.lua";
  long fault_frame = frames / 2;
  if (frames < 20) {
    fprintf(stderr, "usage: host [frames >= 20] [script.lua]\n");
    return 2;
  }
  const int64_t shape[2] = {ROWS, WIDTH};
  lutra_tensor *x = NULL, *target = NULL;
  CK(lutra_tensor_wrap(observations, LUTRA_F32, 2, shape, LUTRA_CPU, sizeof observations, &x));
  CK(lutra_tensor_wrap(wanted, LUTRA_F32, 2, shape, LUTRA_CPU, sizeof wanted, &target));
  printf("inputs: %s\n", x->data == (void *)observations && target->data == (void *)wanted
                             ? "the host's own buffers, wrapped (no copy per frame)"
                             : "copies (not the host's buffers)");

  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  if (luaL_dofile(L, script) != 0 || !lua_istable(L, -1)) {
    fprintf(stderr, "host: loading %s failed: %s\n", script,
            lua_isstring(L, -1) ? lua_tostring(L, -1) : "it returned no table");
    return 2;
  }
  push_function(L, "init");
  lua_pushlightuserdata(L, x);
  lua_pushlightuserdata(L, target);
  if (lua_pcall(L, 2, 0, 0) != 0) {
    fprintf(stderr, "host: init failed: %s\n", lua_tostring(L, -1));
    return 2;
  }

  double first = 0.0, last = 0.0;
  int recovered = 0, failed = 0;
  for (long frame = 0; frame < frames; frame++) {
    sense(); /* into the arrays x and target wrap: the script's next step reads them */
    int depth = 0, enabled = 0, calibrating = 0;
    CK(lutra_autocast_state(&depth, &enabled, &calibrating));
    push_function(L, "step");
    lua_pushinteger(L, frame);
    lua_pushboolean(L, frame == fault_frame);
    if (lua_pcall(L, 2, 1, 0) != 0) {
      /* the script failed mid-step: leave no scope of it entered, then carry on */
      int inside = 0;
      CK(lutra_autocast_state(&inside, &enabled, &calibrating));
      printf("frame %ld: the script failed at autocast depth %d: %s\n", frame, inside,
             lua_tostring(L, -1));
      lua_pop(L, 1);
      CK(lutra_autocast_unwind(depth));
      int after = -1;
      CK(lutra_autocast_state(&after, &enabled, &calibrating));
      printf("frame %ld: unwound the autocast scopes to depth %d\n", frame, after);
      recovered += inside > depth && after == depth;
      failed++;
      continue;
    }
    double loss = lua_tonumber(L, -1);
    lua_pop(L, 1);
    if (frame < 10) first += loss / 10.0;
    if (frame >= frames - 10) last += loss / 10.0;
    if ((frame + 1) % 50 == 0) printf("frame %ld: loss %.5f\n", frame + 1, loss);
  }
  int depth = -1, enabled = 0, calibrating = 0;
  CK(lutra_autocast_state(&depth, &enabled, &calibrating));
  printf("loss: %.5f over the first 10 frames, %.5f over the last 10; %d failed step(s), %d "
         "recovered; autocast depth at the end %d\n",
         first, last, failed, recovered, depth);
  lua_close(L); /* the script's objects go with its state; the host's tensors stay the host's */
  lutra_tensor_unref(x); /* the tensor structs only: the arrays are the host's */
  lutra_tensor_unref(target);
  int ok = failed == 1 && recovered == 1 && depth == 0 && last < 0.2 * first;
  if (!ok) printf("FAIL\n");
  return ok ? 0 : 1;
}

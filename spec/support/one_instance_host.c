/* Built by spec/one_instance_spec.lua: a C host that links liblutra and embeds LuaJIT, then runs
 * Lua code that requires lutra. Both sides must use one library instance: the seed generator
 * the host seeds is the one Lua draws from (and the other way round), and the autocast scope
 * the host entered is the one Lua sees. With two copies each side has its own state, so every
 * check below fails. argv[1]: the Lua chunk to run (it leaves its results in globals).
 * Prints "ok ..." / "FAIL ..." per check; exits 1 on any failure. */
#include <lutra.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include <stdio.h>
#include <string.h>

static int failures;

static void check(int cond, const char *what) {
  printf("%s %s\n", cond ? "ok" : "FAIL", what);
  if (!cond) failures++;
}

static double global_number(lua_State *L, const char *name) {
  lua_getglobal(L, name);
  double v = lua_tonumber(L, -1);
  lua_pop(L, 1);
  return v;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s script.lua\n", argv[0]);
    return 2;
  }
  /* state set on the host's side before Lua runs: a seeded generator, an entered scope */
  const uint64_t seed = 0x5eed1234u;
  lutra_delayed_desc desc;
  lutra_delayed_defaults(&desc);
  lutra_recipe *recipe = NULL;
  lutra_autocast *scope = NULL;
  if (lutra_manual_seed(seed) != LUTRA_OK || lutra_recipe_delayed(&desc, &recipe) != LUTRA_OK ||
      lutra_autocast_new(recipe, NULL, 1, 0, &scope) != LUTRA_OK ||
      lutra_autocast_enter(scope) != LUTRA_OK) {
    printf("FAIL host setup: %s\n", lutra_last_error());
    return 1;
  }

  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  if (luaL_dofile(L, argv[1]) != 0) {
    printf("FAIL the Lua chunk raised: %s\n", lua_tostring(L, -1));
    return 1;
  }
  lua_getglobal(L, "library_path");
  printf("lua loaded %s\n", lua_tostring(L, -1));
  lua_pop(L, 1);

  /* after Lua's lutra.manual_seed(77): the host's next draw is the first of seed 77 */
  uint64_t after_lua = 0, first77 = 0, first = 0;
  lutra_seed_next(&after_lua);
  lutra_manual_seed(77);
  lutra_seed_next(&first77);
  check(after_lua == first77, "the host draws from the generator Lua seeded with 77");
  /* Lua's first draw was the first of the host's seeding */
  lutra_manual_seed(seed);
  lutra_seed_next(&first);
  char text[32];
  snprintf(text, sizeof text, "%lluULL", (unsigned long long)first);
  lua_getglobal(L, "first_seed");
  const char *lua_first = lua_tostring(L, -1);
  check(lua_first && strcmp(lua_first, text) == 0,
        "Lua drew its seed from the generator the host seeded");
  lua_pop(L, 1);
  check(global_number(L, "depth") == 1 && global_number(L, "enabled") == 1,
        "Lua saw the autocast scope the host entered");
  check(global_number(L, "nested_depth") == 2, "Lua's own scope nested inside the host's");
  int depth = -1, enabled = -1, calibrating = -1;
  lutra_autocast_state(&depth, &enabled, &calibrating);
  check(depth == 1, "the host's scope is still the one entered after Lua's own scope exited");
  check(lutra_autocast_exit(scope) == LUTRA_OK, "the host exits its scope");

  lua_close(L);
  lutra_autocast_unref(scope);
  lutra_recipe_unref(recipe);
  printf("one_instance_host: %d failures\n", failures);
  return failures ? 1 : 0;
}

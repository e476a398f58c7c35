-- One library instance per process: a C host linked against the installed liblutra embeds
-- LuaJIT and runs Lua code that requires lutra from the build tree, with LUTRA_LIB naming the
-- build tree's library (another file: loading it would make a second copy). The front must
-- take the copy already loaded, so that the seed generator and the autocast scopes are shared
-- (spec/support/one_instance_host.c checks both ways).
local I = require("spec.support.install_tree")

describe("one library instance per process", function()
  if not io.open("liblutra.so", "rb") then
    pending("skipped: liblutra.so is not built (make)")
    return
  end
  local lj, why = I.luajit_flags()
  if not lj then
    pending("skipped: " .. why)
    return
  end
  if not I.sh("command -v pkg-config") then
    pending("skipped: no pkg-config")
    return
  end
  local tree = I.prefix()

  it("shares the host's copy with the Lua front", function()
    local cc = os.getenv("CC")
    if not cc or cc == "" then cc = "cc" end
    local exe = tree.root .. "/one_instance_host"
    local env = "PKG_CONFIG_PATH=" .. tree.pkgconfig .. " PKG_CONFIG_LIBDIR= "
    local ok, out = I.sh(string.format(
      "%s -std=c11 -Wall -Wextra -Werror -o %s spec/support/one_instance_host.c " ..
      "$(%spkg-config --cflags --libs lutra) %s -Wl,-rpath,%s", cc, exe, env, lj, tree.lib))
    assert(ok, "building the host failed:\n" .. out)
    local _, pwd = I.sh("pwd")
    pwd = pwd:gsub("%s+$", "")
    ok, out = I.sh(string.format(
      "LUTRA_LIB=%s/liblutra.so LUA_PATH='%s/lua/?.lua;%s/lua/?/init.lua' %s " ..
      "spec/support/one_instance.lua", pwd, pwd, pwd, exe))
    assert(ok and out:find("one_instance_host: 0 failures", 1, true), out)
    assert.is_nil(out:find("FAIL", 1, true), out)
    assert(out:find("lua loaded liblutra.so.%d+ %(already loaded%)"), out)
  end)
end)

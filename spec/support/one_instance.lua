-- Run by spec/support/one_instance_host.c inside its own lua_State: requires lutra (the build
-- tree's front, with LUTRA_LIB naming the build tree's library) while the host has the installed
-- copy linked in, and leaves what it saw in globals for the host to check.
local lutra = require("lutra")
local ffi = require("ffi")
library_path = require("lutra.core").library_path
local box = ffi.new("uint64_t[1]")
assert(lutra.C.lutra_seed_next(box) == 0)
first_seed = tostring(box[0])
depth, enabled = lutra.autocast_state()
enabled = enabled and 1 or 0
-- a scope of Lua's own inside the host's: it exits back to depth 1
local scope = lutra.autocast { recipe = lutra.recipe.current {} }
scope:run(function() nested_depth = lutra.autocast_state() end)
lutra.manual_seed(77)

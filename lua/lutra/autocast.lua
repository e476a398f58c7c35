--- Autocast scopes: reusable objects with :enter() and :exit(), plus :run(fn, ...) which always
-- exits, also when fn raises. enter/exit are single FFI calls: nothing else happens in Lua.
-- @module lutra.autocast
local core = require("lutra.core")
local chk = require("lutra.check")
local ffi, C, check = core.ffi, core.C, core.check

local M = {}
local Scope = {}
Scope.__index = Scope

--- lutra.autocast{recipe=r, enabled=true, calibrating=false}
-- enabled defaults to true when a recipe is given and calibrating is not asked for.
function M.new(opts)
  opts = core.check_options(opts, { recipe = true, enabled = true, calibrating = true, group = true },
                            "lutra.autocast")
  local where = "lutra.autocast"
  if opts.recipe ~= nil and not ffi.istype(chk.recipe_t, opts.recipe) then
    error(string.format("%s: recipe must be a recipe (got %s)", where, chk.got(opts.recipe)), 2)
  end
  if opts.group ~= nil and not ffi.istype(chk.group_t, opts.group) then
    error(string.format("%s: group must be a group (got %s)", where, chk.got(opts.group)), 2)
  end
  if opts.enabled ~= nil then chk.boolean(opts.enabled, "enabled", where) end
  if opts.calibrating ~= nil then chk.boolean(opts.calibrating, "calibrating", where) end
  local calibrating = opts.calibrating and true or false
  local enabled = opts.enabled
  if enabled == nil then enabled = opts.recipe ~= nil and not calibrating end
  local box = ffi.new("lutra_autocast*[1]")
  check(C.lutra_autocast_new(opts.recipe, opts.group, enabled and 1 or 0, calibrating and 1 or 0, box))
  return ffi.gc(box[0], C.lutra_autocast_unref)
end

--- An autocast scope (lutra.autocast{...}): reusable; enter and exit are single C calls.
-- @type Scope

--- Enters the scope (refused when it is entered already). Modules' forwards inside it use
-- its recipe. Pair with :exit(), or use :run(), which always exits.
function Scope:enter()
  if C.lutra_autocast_enter(self) ~= 0 then core.fail() end
end

--- Exits the scope (refused when it is not the innermost). The outermost exit runs one
-- delayed-scaling update for every quantizer used inside.
function Scope:exit()
  if C.lutra_autocast_exit(self) ~= 0 then core.fail() end
end

local run_depth = ffi.new("int[3]")

local function finish(scope, depth, ok, ...)
  if not ok then
    -- fn raised, maybe inside scopes of its own it never exited: leave all of them and this one
    -- (the amaxes of the failed step are dropped, not used for the update)
    C.lutra_autocast_unwind(depth)
    error((...), 0)
  end
  local st = C.lutra_autocast_exit(scope)
  if st == C.LUTRA_RULES_PENDING then
    core.run_rules() -- the scope has exited; a failing rule raises here
  elseif st ~= 0 then
    local msg = ffi.string(C.lutra_last_error())
    C.lutra_autocast_unwind(depth)
    error("scope:run: " .. msg, 2)
  end
  return ...
end

--- Runs fn(...) inside the scope and returns its results. On an error in fn the thread is back
-- at the depth it had before, whatever fn entered; the error is raised again.
function Scope:run(fn, ...)
  if type(fn) ~= "function" then
    local mt = getmetatable(fn)
    if not (type(mt) == "table" and mt.__call) then
      error("scope:run: argument 1 must be a function, got " .. type(fn), 2)
    end
  end
  C.lutra_autocast_state(run_depth, run_depth + 1, run_depth + 2)
  local depth = run_depth[0]
  self:enter()
  return finish(self, depth, pcall(fn, ...))
end

--- @section end

--- lutra.autocast_unwind(depth): exits every scope of this thread above depth (error recovery
-- for code that enters scopes by hand; depth from lutra.autocast_state())
function M.unwind(depth)
  chk.integer(depth, "depth", "lutra.autocast_unwind", 0, 2 ^ 31 - 1)
  check(C.lutra_autocast_unwind(depth))
end

--- @type Scope

--- Frees the scope now; later calls on it are errors.
function Scope:destroy() check(C.lutra_autocast_destroy(self)) end

ffi.metatype("struct lutra_autocast", { __index = Scope })

--- @section end

--- depth, enabled, calibrating of the calling thread
function M.state()
  local b = core.int_box
  check(C.lutra_autocast_state(b, b + 1, b + 2))
  return b[0], b[1] ~= 0, b[2] ~= 0
end

local updates_box, count_box = ffi.new("uint64_t[1]"), ffi.new("int[1]")
--- number of delayed-scaling updates run on this thread, and how many quantizers the last covered
function M.update_stats()
  check(C.lutra_autocast_update_stats(updates_box, count_box))
  return tonumber(updates_box[0]), count_box[0]
end

return M

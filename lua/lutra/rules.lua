--- Scaling rules written in Lua for delayed scaling, TransformerEngine's callables:
--   lutra.recipe.delayed{
--     amax_compute_algo = function(history, n) ... return amax end,
--     scaling_factor_compute_algo = function(amax, old_scale, fp8_max, margin) ... return s end }
-- history is a float* (0-based) of n values: history[0] is this step's amax, history[1..n-1] the
-- earlier steps' from the oldest to the newest (TE's amax_history before its roll). Either rule
-- may be left out: the built-in one (max or most_recent; (fp8_max / 2^margin) / amax) takes
-- its place. The rules run where the built-in update runs: at the exit of the outermost scope
-- for input and weight, and in the backward of the scope's first module for grad_output. The
-- C update sets their quantizers aside and returns LUTRA_RULES_PENDING; this file then takes
-- them (the histories copied and rolled; on CUDA one copy to the host and a sync), runs the
-- rules and applies the scales (on CUDA one copy back and a sync). C never calls into Lua
-- (LuaJIT cannot compile across a callback, and a callback from a compiled trace fails), so the
-- rules compile into the training loop's trace. A rule with a loop of its own (over the
-- history) compiles, but as a trace of its own that the training loop's cannot contain: keep
-- the per-step rule loop-free where the loop must be one trace (the EMA of the examples keeps
-- its state in old_scale).
-- A rule that returns a non-number, NaN, an infinity, zero or a negative value (an amax rule: a
-- non-number, NaN or a negative value) is an error naming the rule, raised after the update:
-- that quantizer keeps its old scale (its history rolls), the others are updated. A rule that
-- raises propagates its own error, and every quantizer of that update keeps its old scale. An
-- amax of 0 or +inf keeps the old scale without calling the scaling rule, as the built-in
-- update does.
-- @module lutra.rules
local core = require("lutra.core")
local ffi, C = core.ffi, core.C

local M = {}

-- The rules by id, in the Lua registry: one table per Lua state, also when this file is loaded
-- again (busted reloads the modules of every spec file), since the ids a quantizer carries are
-- the process's.
local reg = debug.getregistry()
reg.lutra_rules = reg.lutra_rules or { amax = {}, scale = {}, names = {}, count = 0 }
local R = reg.lutra_rules
local amax_rules, scale_rules, names = R.amax, R.scale, R.names

local function describe(fn)
  local info = debug.getinfo(fn, "S")
  return string.format("%s:%d", info.short_src or "?", info.linedefined or 0)
end

--- Registers a pair of rules (either may be nil); returns the id a recipe carries.
-- @local internal: lutra.recipe.delayed calls it
function M.register(amax_fn, scale_fn, where)
  R.count = R.count + 1
  local count = R.count
  amax_rules[count] = amax_fn or false
  scale_rules[count] = scale_fn or false
  names[count] = {
    amax = amax_fn and string.format("%s: amax_compute_algo (the function at %s)", where,
                                     describe(amax_fn)),
    scale = scale_fn and string.format("%s: scaling_factor_compute_algo (the function at %s)",
                                       where, describe(scale_fn)),
  }
  return count
end

local items_box, n_box = ffi.new("lutra_rule_item*[1]"), ffi.new("int[1]")
local round = ffi.new("float[1]")
local FLT_MAX = 3.4028234663852886e38
local HUGE = math.huge

-- The built-in scale bit for bit: divided in double and rounded once to f32, which equals the
-- f32 division (both operands are f32 values and fp8_max / 2^margin is exact). The built-in
-- amax comes from C (item.amax): a loop here would be a trace of its own (see run_one).
local function bad(v)
  if type(v) ~= "number" then return "a " .. type(v) end
  if v ~= v then return "nan" end
  if v == HUGE or v == -HUGE then return tostring(v) end
  if v <= 0 then return tostring(v) end
  return nil
end

-- The rules are called directly, not through pcall: a trace that starts in a function called by
-- pcall cannot return through it (LuaJIT 2.1: "NYI: return to lower frame"), and the take has
-- already rolled the histories, so a rule that raises leaves every quantizer of the update
-- consistent, with its old scale.
local function run_one(it)
  local id = it.rule
  local afn, sfn = amax_rules[id], scale_rules[id]
  if afn == nil then
    return string.format("lutra.rules: scaling rule %d is not registered in this Lua state", id)
  end
  local amax
  if afn then
    amax = afn(it.history, it.history_len)
    if type(amax) ~= "number" or amax ~= amax or amax < 0 then
      return names[id].amax .. " returned " ..
             (type(amax) == "number" and tostring(amax) or "a " .. type(amax)) ..
             "; the old scale is kept"
    end
  else
    amax = it.amax
  end
  if not (amax > 0 and amax < HUGE) then return nil end -- nothing observed: keep the scale
  if sfn then
    local v = sfn(amax, it.scale, it.fp8_max, it.margin)
    local why = bad(v)
    if why then return names[id].scale .. " returned " .. why .. "; the old scale is kept" end
    round[0] = v
    if round[0] == 0 then
      return names[id].scale .. " returned " .. tostring(v) .. " (0 in f32); the old scale is kept"
    end
  else
    round[0] = (it.fp8_max / 2 ^ it.margin) / amax
  end
  local s = round[0]
  if s == HUGE then s = FLT_MAX end
  it.new_scale = s
  return nil
end

local function fail_c() error(ffi.string(C.lutra_last_error()), 0) end

-- The items of one update, run without a loop: a Lua loop inside a function that the training
-- loop calls stops LuaJIT from compiling the training loop as one trace (an inner loop in a
-- callee is a trace of its own, and the side trace leaving it cannot return to the caller's
-- frame). So the first UNROLLED items run through straight-line code made once here; only an
-- update of more quantizers than that loops over the rest.
local UNROLLED = 48
local unrolled
do
  local src = { "local run_one, items, n = ...\nlocal err, e\n" }
  for i = 0, UNROLLED - 1 do
    src[#src + 1] = string.format(
      "if n <= %d then return err end\ne = run_one(items[%d])\nif e and not err then err = e end\n", i, i)
  end
  src[#src + 1] = "for i = " .. UNROLLED .. ", n - 1 do\n" ..
                  "  e = run_one(items[i])\n  if e and not err then err = e end\nend\nreturn err\n"
  local chunk = assert(loadstring(table.concat(src), "=lutra.rules (unrolled)"))
  unrolled = function(items, n) return chunk(run_one, items, n) end
end

--- Runs the pending rules and applies their scales; raises the first rule's error after the
-- update (the other quantizers updated, the failing ones with their old scale).
-- @local internal: core.fail and core.check call it (as core.run_rules)
function M.run()
  if C.lutra_rules_take(items_box, n_box) ~= 0 then fail_c() end
  local err = unrolled(items_box[0], n_box[0])
  if C.lutra_rules_apply() ~= 0 then fail_c() end
  if err then error(err, 0) end
end

core.run_rules = M.run
return M

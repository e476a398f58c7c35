-- The norm-fused modules in a training loop compile to a LuaJIT trace (as spec/jit_spec.lua checks
-- for Linear): the loop of spec/support/jit_prenorm_loop.lua (Residual, LayerNormMLP,
-- LayerNormLinear, RMSNorm, Linear) runs in its own process with -jv, and must form a loop trace
-- with no NYI abort, per recipe.
local LUAJIT = os.getenv("LUAJIT") or "luajit"
local LOOP = "spec/support/jit_prenorm_loop.lua"

local function loop_line()
  local n = 0
  for line in io.lines(LOOP) do
    n = n + 1
    if line:find("TRAINING LOOP", 1, true) then return n end
  end
  error("no TRAINING LOOP marker in " .. LOOP)
end

local function run(recipe)
  local log = os.tmpname()
  local p = assert(io.popen(string.format("%s -jv=%s %s %s 2>&1", LUAJIT, log, LOOP, recipe)))
  local out = p:read("*a")
  p:close()
  local f = assert(io.open(log))
  local trace = f:read("*a")
  f:close()
  os.remove(log)
  assert(out:find("total loss"), "the loop did not run:\n" .. out)
  local where = (LOOP:match("[^/]+$") .. ":"):gsub("%p", "%%%0")
  local loops, aborts = 0, {}
  for line in trace:gmatch("[^\n]+") do
    if line:find("^%[TRACE%s+%d+ .*" .. where .. loop_line() .. " loop%]") then loops = loops + 1 end
    if line:find("^%[TRACE %-%-%-") and line:find("NYI", 1, true) then aborts[#aborts + 1] = line end
  end
  return loops, aborts, trace
end

describe("LuaJIT traces of a pre-norm training loop", function()
  for _, recipe in ipairs { "none", "delayed", "mxfp8" } do
    it("form a loop trace without NYI aborts with recipe " .. recipe, function()
      local loops, aborts, trace = run(recipe)
      assert.are.same({}, aborts)
      assert.is_true(loops >= 1, "no loop trace formed at the training loop:\n" .. trace)
    end)
  end
end)

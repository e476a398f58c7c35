-- An MoE step from Lua (lutra.moe router, permute, unpermute and backwards) compiles to a LuaJIT
-- loop trace without NYI aborts, as spec/jit_spec.lua checks for the MLP step: the loop runs in
-- its own process with -jv and the trace log is read.
local LUAJIT = os.getenv("LUAJIT") or "luajit"
local LOOP = "spec/support/moe_jit_loop.lua"

local function loop_line()
  local n = 0
  for line in io.lines(LOOP) do
    n = n + 1
    if line:find("TRAINING LOOP", 1, true) then return n end
  end
  error("no TRAINING LOOP marker in " .. LOOP)
end

describe("LuaJIT traces of an MoE training loop", function()
  it("form a loop trace without NYI aborts", function()
    local log = os.tmpname()
    local p = assert(io.popen(string.format("%s -jv=%s %s 2>&1", LUAJIT, log, LOOP)))
    local out = p:read("*a")
    p:close()
    local f = assert(io.open(log))
    local trace = f:read("*a")
    f:close()
    os.remove(log)
    assert(out:find("total loss"), "the loop did not run:\n" .. out)
    local pat = "^%[TRACE%s+%d+ .*moe_jit_loop%.lua:" .. loop_line() .. " loop%]"
    local loops, aborts = 0, {}
    for line in trace:gmatch("[^\n]+") do
      if line:find(pat) then loops = loops + 1 end
      if line:find("^%[TRACE %-%-%-") and line:find("NYI", 1, true) then aborts[#aborts + 1] = line end
    end
    assert.are.same({}, aborts)
    assert.is_true(loops >= 1, "no loop trace formed at the training loop:\n" .. trace)
  end)
end)

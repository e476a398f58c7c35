-- A training step from Lua must compile to a LuaJIT trace: an abort (an NYI in the front, a
-- table built per call, a C call LuaJIT cannot compile) would put the interpreter back on the
-- hot path. This watches LuaJIT's trace events around a training loop.
local lutra = require("lutra")
local jit_util = require("jit.util")
local vmdef = require("jit.vmdef")
local nn = lutra.nn

local function training_setup(recipe)
  local net = nn.Sequential(nn.Linear(32, 64, { seed = 3 }), nn.GELU(), nn.Linear(64, 32, { seed = 4 }))
  return {
    net = net,
    x = lutra.tensor({ 32, 32 }):randn(11),
    target = lutra.tensor({ 32, 32 }):randn(12),
    loss = nn.MSELoss(),
    opt = lutra.optim.AdamW(net, { lr = 1e-3 }),
    scope = lutra.autocast { recipe = recipe },
  }
end

-- The loop under test: what a user writes for a training step.
local function train(s, steps)
  local net, x, target, loss, opt, scope = s.net, s.x, s.target, s.loss, s.opt, s.scope
  local total = 0
  for _ = 1, steps do
    scope:enter()
    local y = net:forward(x)
    scope:exit()
    loss:forward(y, target)
    net:backward(loss:backward())
    opt:step()
    total = total + loss:value()
  end
  return total
end

local function watch(fn)
  local events = { aborts = {}, loops = 0, traces = 0 }
  local function on_trace(what, tr, func, pc, otr, oex)
    if what == "abort" then
      local info = jit_util.funcinfo(func, pc)
      local msg = vmdef.traceerr[otr] or tostring(otr)
      if type(oex) == "number" and msg:find("%%d") then msg = msg:format(oex) end
      events.aborts[#events.aborts + 1] = string.format("%s at %s", msg, tostring(info.loc))
    elseif what == "stop" then
      events.traces = events.traces + 1
      local ti = jit_util.traceinfo(tr)
      if ti and ti.linktype == "loop" then events.loops = events.loops + 1 end
    end
  end
  jit.flush()
  jit.attach(on_trace, "trace")
  local ok, err = pcall(fn)
  jit.attach(on_trace)
  assert(ok, err)
  return events
end

describe("LuaJIT traces of a training loop", function()
  for _, name in ipairs { "none", "delayed", "current", "mxfp8" } do
    it("compile without aborts with recipe " .. name, function()
      local recipe = lutra.recipe.named(name, name == "delayed" and { amax_history_len = 16 } or nil)
      local s = training_setup(recipe)
      local events = watch(function() train(s, 300) end)
      assert.are.same({}, events.aborts)
      assert.is_true(events.loops >= 1, "no loop trace formed")
    end)
  end

  it("reports an abort when the loop does something that cannot be compiled", function()
    -- guards the guard: a loop that calls an NYI builtin must be caught by watch()
    local events = watch(function()
      local t = {}
      for i = 1, 300 do t[#t + 1] = string.format("%d", i) end -- string.format is NYI here
      return #t
    end)
    -- string.format with %d compiles in recent LuaJIT 2.1; fall back to a sure NYI
    if #events.aborts == 0 then
      events = watch(function()
        local n = 0
        for _ = 1, 300 do n = n + select("#", pcall(error)) end -- pcall is NYI in traces
        return n
      end)
    end
    assert.is_true(#events.aborts > 0)
  end)
end)

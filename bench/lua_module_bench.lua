-- What a module written in Lua costs on the host (lutra.lua_module): per training step
-- (forward + backward), a C Sequential beside the same Sequential with a Lua block after it,
-- measured side by side in one run (batches of the two alternate, and which runs first; the
-- median of 21 batches).
--   identity   the Lua block returns its input and its gradient: the Lua Sequential's own cost
--   residual   y = x + f(x) in Lua around a C Sequential f (two lutra.add calls a step) beside
--              nn.Residual(f), the same computation in C
-- Tiny shapes, so that the step's compute does not hide the host's work; on the cpu the
-- compute is in the figures (the differences are the Lua side's), on cuda the launches are
-- asynchronous and the figures are the host's.
-- Run: luajit bench/lua_module_bench.lua [--device cpu|cuda] [--steps N]
local lutra = require("lutra")
local timing = require("bench.support.timing")
local nn = lutra.nn

local argparse = require("lutra.cli").argparse("lua_module_bench.lua")
local cli = argparse("lua_module_bench.lua", "Host cost per step of a Lua module in a Sequential.")
cli:option("--device", "cpu or cuda", lutra.default_device)
cli:option("--steps", "steps per batch", "2000")
local args = cli:parse(arg)
local device, steps = args.device, tonumber(args.steps)
if not steps or steps < 1 or steps % 1 ~= 0 then
  io.stderr:write("lua_module_bench.lua: --steps must be a positive integer\n")
  os.exit(2)
end

local BATCHES, D = 21, 16

local Identity = nn.Module("Identity")
function Identity.forward(_, x) return x end
function Identity.backward(_, dy) return dy end

local Res = nn.Module("LuaResidual")
function Res:init(f) self.f = self:add(f) end
function Res:forward(x, opts) return lutra.add(x, self.f:forward(x, opts), self:buffer("y", x)) end
function Res:backward(dy)
  return lutra.add(dy, self.f:backward(dy), self:buffer("dx", dy))
end

local function mlp(seed)
  return nn.Sequential(nn.Linear(D, D, { seed = seed, device = device }), nn.GELU(),
                       nn.Linear(D, D, { seed = seed + 1, device = device }))
end

local x = lutra.tensor({ 8, D }, "f32", device):randn(1)
local dy = lutra.tensor({ 8, D }, "f32", device):randn(2)
local function step_of(net) return function() net:forward(x); net:backward(dy) end end

-- on the cpu the process's CPU time (os.clock: what other processes on a shared machine take is
-- left out), on cuda the wall time until the device is done
local clock = device == "cpu" and os.clock or lutra.now
local function per_step(f)
  local t0 = clock()
  for _ = 1, steps do f() end
  lutra.synchronize(device)
  return (clock() - t0) / steps * 1e6
end

-- median microseconds per step of a and of b: batches alternate, and so does which runs first
local function pair(a, b)
  for _ = 1, steps do a(); b() end
  local ta, tb = {}, {}
  for i = 1, BATCHES do
    if i % 2 == 1 then
      ta[i] = per_step(a)
      tb[i] = per_step(b)
    else
      tb[i] = per_step(b)
      ta[i] = per_step(a)
    end
  end
  return (timing.median(ta)), (timing.median(tb))
end

local c_net = mlp(10)
local lua_net = nn.Sequential(mlp(10), Identity())
local c_id, lua_id = pair(step_of(c_net), step_of(lua_net))
local c_res, lua_res = pair(step_of(nn.Residual(mlp(20))), step_of(nn.Sequential(Res(mlp(20)))))

local rows = {
  { "identity block after a C Sequential (Linear, GELU, Linear)", c_id, lua_id },
  { "residual x + f(x): nn.Residual(f) vs a Lua block", c_res, lua_res },
}
print(string.format("lua_module_bench (%s, x [8, %d], host us per forward+backward step)",
                    device, D))
print("| work | C | with Lua | Lua's cost |")
print("|---|---|---|---|")
for _, r in ipairs(rows) do
  print(string.format("| %s | %.2f | %.2f | %+.2f |", r[1], r[2], r[3], r[3] - r[2]))
end

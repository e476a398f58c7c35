-- Host cost per training step of a Lua scaling rule beside the built-in delayed update:
--   luajit bench/rules_overhead.lua [--device cpu|cuda] [--steps 2000] [--depth 4]
-- The same MLP (depth Linears of 64 features, batch 64, GELUs between) trained under
-- lutra.recipe.delayed{amax_history_len = 16} and under the same recipe with a Lua rule (the
-- lab's ema_rule); per step: wall time (on CUDA a step with a Lua rule waits twice for the
-- device: the histories' copy to the host at the scope's exit and at the backward trigger) and
-- the time of the scope exit plus the backward, where the updates run.
local lutra = require("lutra")
local nn = lutra.nn

local o = { device = lutra.default_device, steps = 2000, depth = 4 }
for i = 1, #arg, 2 do
  local k = arg[i]:match("^%-%-(.+)$")
  assert(k and o[k] ~= nil and arg[i + 1], "usage: rules_overhead.lua [--device D] [--steps N] [--depth N]")
  o[k] = tonumber(arg[i + 1]) or arg[i + 1]
end

local function ema_rule(amax, old_scale, fp8_max, margin)
  local top = fp8_max / 2 ^ (margin + 1)
  local ema = old_scale == 1 and amax or 0.8 * (top / old_scale) + 0.2 * amax
  return top / ema
end

local recipes = {
  { "built-in delayed", lutra.recipe.delayed { amax_history_len = 16 } },
  { "Lua rule", lutra.recipe.delayed { amax_history_len = 16, amax_compute_algo = function(h) return h[0] end,
                                       scaling_factor_compute_algo = ema_rule } },
}

local function bench(recipe)
  local mods = {}
  for l = 1, o.depth do
    mods[#mods + 1] = nn.Linear(64, 64, { seed = l, device = o.device })
    if l < o.depth then mods[#mods + 1] = nn.GELU() end
  end
  local net = nn.Sequential(unpack(mods))
  local x = lutra.tensor({ 64, 64 }, "f32", o.device):randn(1)
  local dy = lutra.tensor({ 64, 64 }, "f32", o.device):randn(2, 0, 0.01)
  local scope = lutra.autocast { recipe = recipe }
  local now = lutra.now
  local total, update = 0, 0
  for step = 1, o.steps + 100 do
    local t0 = now()
    scope:enter()
    net:forward(x)
    local t1 = now()
    scope:exit()
    net:backward(dy, false)
    local t2 = now()
    if step > 100 then -- warm-up (plans, buffers, traces) excluded
      total = total + (t2 - t0)
      update = update + (t2 - t1)
    end
  end
  lutra.synchronize(o.device)
  return total / o.steps * 1e6, update / o.steps * 1e6
end

print(string.format("device %s, %d Linears of 64, %d steps (us per step)", o.device, o.depth, o.steps))
print("| recipe | step (forward, exit, backward) | exit + backward |")
print("|---|---:|---:|")
for _, r in ipairs(recipes) do
  local step, upd = bench(r[2])
  print(string.format("| %s | %.1f | %.1f |", r[1], step, upd))
end

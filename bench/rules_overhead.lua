-- Host cost per training step of a Lua scaling rule beside the built-in delayed update:
--   luajit bench/rules_overhead.lua [--device cpu|cuda] [--steps 2000] [--depth 4] [--reps 5]
-- The same MLP (depth Linears of 64 features, batch 64, GELUs between) trained under
-- lutra.recipe.delayed{amax_history_len = 16} and under the same recipe with a Lua rule (the
-- lab's ema_rule); per step: wall time (on CUDA a step with a Lua rule waits twice for the
-- device: the histories' copy to the host at the scope's exit and at the backward trigger) and
-- the time of the scope exit plus the backward, where the updates run, and of the exit alone
-- (the forward roles' update, without the backward's GEMMs around it).
local lutra = require("lutra")
local nn = lutra.nn

-- the command line, parsed with lua-argparse (Debian: lua-argparse)
local function parse(argv)
  local argparse = require("lutra.cli").argparse("rules_overhead.lua")
  local p = argparse("rules_overhead.lua",
                     "Host cost per training step of a Lua scaling rule beside the built-in one.")
  p:option("--device", "cpu or cuda (LUTRA_DEVICE sets the default)", lutra.default_device)
   :choices({ "cpu", "cuda" })
  p:option("--steps", "timed steps per repetition", "2000", tonumber)
  p:option("--depth", "Linears in the MLP", "4", tonumber)
  p:option("--reps", "repetitions, the two recipes interleaved; the median is printed", "5",
           tonumber)
  return p:parse(argv)
end

local o = parse(arg)

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
  local total, update, exit = 0, 0, 0
  for step = 1, o.steps + 100 do
    local t0 = now()
    scope:enter()
    net:forward(x)
    local t1 = now()
    scope:exit()
    local t2 = now()
    net:backward(dy, false)
    local t3 = now()
    if step > 100 then -- warm-up (plans, buffers, traces) excluded
      total = total + (t3 - t0)
      update = update + (t3 - t1)
      exit = exit + (t2 - t1)
    end
  end
  lutra.synchronize(o.device)
  return total / o.steps * 1e6, update / o.steps * 1e6, exit / o.steps * 1e6
end

-- the recipes are interleaved, each repetition with fresh modules, so that a load that comes
-- and goes on the machine reaches both alike; the median and the range are printed
local function median(t)
  table.sort(t)
  local n = #t
  return n % 2 == 1 and t[(n + 1) / 2] or (t[n / 2] + t[n / 2 + 1]) / 2
end

local steps, updates, exits = {}, {}, {}
for i = 1, #recipes do steps[i], updates[i], exits[i] = {}, {}, {} end
for _ = 1, o.reps do
  for i, r in ipairs(recipes) do
    local step, upd, ex = bench(r[2])
    steps[i][#steps[i] + 1], updates[i][#updates[i] + 1], exits[i][#exits[i] + 1] = step, upd, ex
  end
end

print(string.format("device %s, %d Linears of 64, %d steps x %d repetitions (us per step: "
                    .. "median [min, max])", o.device, o.depth, o.steps, o.reps))
print("| recipe | step (forward, exit, backward) | exit + backward | exit (the forward roles' update) |")
print("|---|---:|---:|---:|")
local function cell(t)
  local m = median(t)
  return string.format("%.1f [%.1f, %.1f]", m, t[1], t[#t])
end
for i, r in ipairs(recipes) do
  print(string.format("| %s | %s | %s | %s |", r[1], cell(steps[i]), cell(updates[i]),
                      cell(exits[i])))
end

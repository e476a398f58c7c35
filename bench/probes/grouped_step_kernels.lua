-- Where a GroupedLinear training step's time goes (issue 43's 1.3x step target): the step of
-- bench/grouped_bench.lua --part step (forward with the experts' weights quantized in the call,
-- then backward) for one mode, run twice, for ncu to list each kernel's time. Nothing is timed
-- here; run it under ncu and read the second step's kernels:
--   ncu --clock-control none --metrics gpu__time_duration.sum \
--     luajit bench/probes/grouped_step_kernels.lua delayed [E K N]
-- Modes: bf16, delayed, current. Balanced splits, tokens 16384 (TOKENS overrides).
local lutra = require("lutra")
local mode = arg[1] or "delayed"
local E, K, N = tonumber(arg[2] or 64), tonumber(arg[3] or 4096), tonumber(arg[4] or 4096)
local T = tonumber(os.getenv("TOKENS") or 16384)
local DEV = os.getenv("LUTRA_DEVICE") or "cuda" -- cpu: a smoke test
assert(mode == "bf16" or mode == "delayed" or mode == "current",
       "mode must be bf16, delayed or current, got " .. tostring(mode))
local g = lutra.nn.GroupedLinear(E, K, N, { dtype = "bf16", device = DEV, bias = false, seed = 7 })
local x = lutra.tensor({ T, K }, "bf16", DEV):fill(0.25)
local dy = lutra.tensor({ T, N }, "bf16", DEV):fill(0.125)
local splits = {}
for e = 1, E do splits[e] = math.floor(T / E) end
splits[E] = T - (E - 1) * math.floor(T / E)
local sp = lutra.from_table(splits, { E }, "i32", DEV)
local scope = mode ~= "bf16" and lutra.autocast {
  recipe = mode == "delayed" and lutra.recipe.delayed { amax_history_len = 16 }
    or lutra.recipe.current {} }
for i = 1, 2 do
  if scope then
    scope:run(function() g:forward(x, sp, true) end)
  else
    g:forward(x, sp)
  end
  g:backward(dy)
  lutra.synchronize(DEV)
  io.stderr:write(string.format("step %d of %s done\n", i, mode))
end

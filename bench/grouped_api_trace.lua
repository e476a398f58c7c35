#!/usr/bin/env luajit
-- Where a GroupedLinear forward's host time goes below lutra: a loop of bf16 forwards (8 experts
-- x 16 rows of 64 -> 64, device m_splits from a ring of 16, as bench/grouped_bench.lua's host
-- part) to run under Nsight Systems, whose CUDA API summary gives the time of each runtime call
-- per forward (k_setup's launch, the CUTLASS kernel's cudaLaunchKernelExC, the error checks).
-- The loop's own time per forward, printed first, minus those calls is lutra's own work.
--   nsys profile -t cuda -o /tmp/gat --force-overwrite true \
--     luajit bench/grouped_api_trace.lua [calls] [experts]
--   nsys stats -r cuda_api_sum /tmp/gat.nsys-rep
-- (LUA_PATH="lua/?.lua;lua/?/init.lua;;", after make CUDA=1)
local lutra = require("lutra")
local nn = lutra.nn

local calls = tonumber(arg[1]) or 20000
local E = tonumber(arg[2]) or 8
local rows, K, N = 16, 64, 64
local T = E * rows

local function splits(seed)
  math.randomseed(seed)
  local s, left = {}, T
  for e = 1, E do
    local v = e == E and left or math.min(left, math.floor(T / E + (math.random() - 0.5) * T / E))
    s[e], left = v, left - v
  end
  return lutra.from_table(s, { E }, "i32", "cuda")
end

local m = nn.GroupedLinear(E, K, N, { dtype = "bf16", device = "cuda", seed = 1 })
local x = lutra.tensor({ T, K }, "bf16", "cuda"):randn(2)
local ring = {}
for i = 1, 16 do ring[i] = splits(i) end

local function loop(n)
  for i = 1, n do m:forward(x, ring[i % 16 + 1]) end
  lutra.synchronize("cuda")
end

loop(200)
local t0 = os.clock()
loop(calls)
local dt = os.clock() - t0
print(string.format("%d bf16 forwards (%d experts x %d rows, %d -> %d): %.2f us each (CPU time)",
                    calls, E, rows, K, N, dt / calls * 1e6))
m:check_splits()

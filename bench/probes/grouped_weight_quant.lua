-- What quantizing a GroupedLinear's experts' weights costs (issue 43's "one launch at >= 80% of
-- copy bandwidth"): the FP8 forward timed with the weights quantized in the call and with them
-- cached (is_first_microbatch false), alternating, medians; the difference is the weight
-- quantization. Beside it a device copy of the weights' bytes (a bf16 tensor copied: 4 bytes
-- moved per element), timed in the same batches. Bytes the quantization must move per weight
-- element: 2 read, 1 + 1 written (both FP8 copies); current scaling reads the weights twice when
-- its amax pass misses in L2 (6), delayed once (4). Nothing is asserted.
--   LUA_PATH="lua/?.lua;lua/?/init.lua;;" luajit bench/probes/grouped_weight_quant.lua [E K N]
-- With NCU=1 it only runs two quantizing forwards per recipe (for ncu's kernel list).
local lutra = require("lutra")
local timing = require("bench.support.timing")
local nn = lutra.nn
local E, K, N = tonumber(arg[1] or 64), tonumber(arg[2] or 4096), tonumber(arg[3] or 4096)
local T = tonumber(os.getenv("TOKENS") or 16384)
local DEV = os.getenv("LUTRA_DEVICE") or "cuda" -- cpu: a smoke test
local g = nn.GroupedLinear(E, K, N, { dtype = "bf16", device = DEV, bias = false, seed = 7 })
local x = lutra.tensor({ T, K }, "bf16", DEV):randn(5)
local splits = {}
local each = math.floor(T / E)
for e = 1, E do splits[e] = each end
splits[E] = T - (E - 1) * each
local sp = lutra.from_table(splits, { E }, "i32", DEV)
local src = lutra.tensor({ E * K, N }, "bf16", DEV):fill(0.5) -- a device fill: randn draws on the host
local dst = lutra.tensor({ E * K, N }, "bf16", DEV)
local scopes = {
  current = lutra.autocast { recipe = lutra.recipe.current {} },
  delayed = lutra.autocast { recipe = lutra.recipe.delayed { amax_history_len = 16 } },
}
local function fwd(scope, first)
  return function() scope:run(function() g:forward(x, sp, first) end) end
end

if os.getenv("NCU") == "1" then
  for _, name in ipairs { "delayed", "current" } do
    for _ = 1, 2 do fwd(scopes[name], true)() end
  end
  lutra.synchronize(DEV)
  return
end

local elems = E * K * N
local function copy() dst:copy(src) end
print(string.format("| experts | K -> N | recipe | forward, weights quantized us | cached us | "
                    .. "quantization us | GB/s (4 B/elem) | copy GB/s | x copy |"))
print("|---:|---|---|---:|---:|---:|---:|---:|---:|")
for _, name in ipairs { "delayed", "current" } do
  local s = scopes[name]
  local q, c, cp = {}, {}, {}
  for r = 1, 7 do
    q[r] = timing.time_per_call(DEV, fwd(s, true), 5, 1)
    c[r] = timing.time_per_call(DEV, fwd(s, false), 5, 1)
    cp[r] = timing.time_per_call(DEV, copy, 5, 1)
  end
  local tq, tc, tcp = timing.median(q), timing.median(c), timing.median(cp)
  local dq = tq - tc
  local bw, cbw = 4 * elems / dq / 1e9, 4 * elems / tcp / 1e9
  print(string.format("| %d | %d -> %d | %s | %.1f | %.1f | %.1f | %.0f | %.0f | %.2f |", E, K, N,
                      name, tq * 1e6, tc * 1e6, dq * 1e6, bw, cbw, bw / cbw))
end

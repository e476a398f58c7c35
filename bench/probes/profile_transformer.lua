-- Where a TransformerLayer forward's host time goes (a tool: nothing is asserted): the layer of
-- bench/attention_bench.lua's host part (hidden 256, ffn 1024, H 4, B 1, T 128, bf16) in
-- batches of 200 calls with a sync between them under gperftools' CPU profiler (as
-- bench/profile_grouped.lua does for GroupedLinear).
--   CPUPROFILE_FREQUENCY=4000 luajit bench/probes/profile_transformer.lua OUT.prof [calls]
local lutra = require("lutra")
local ffi, nn = lutra.ffi, lutra.nn
ffi.cdef [[ int ProfilerStart(const char *fname); void ProfilerStop(void); ]]
local prof = ffi.load(os.getenv("LIBPROFILER") or "libprofiler.so.0")
local out, calls = arg[1] or "transformer.prof", tonumber(arg[2] or 200000)
local layer = nn.TransformerLayer(256, 1024, 4, { dtype = "bf16", device = "cuda" })
local x = lutra.tensor({ 1, 128, 256 }, "bf16", "cuda"):randn(5)
for _ = 1, 2000 do layer:forward(x) end
lutra.synchronize("cuda")
prof.ProfilerStart(out)
local timed, n = 0, 200 * math.floor(calls / 200)
for _ = 1, n / 200 do
  local t1 = lutra.now()
  for _ = 1, 200 do layer:forward(x) end
  timed = timed + (lutra.now() - t1)
  lutra.synchronize("cuda")
end
prof.ProfilerStop()
print(string.format("TransformerLayer forward: %.3f us a call over %d calls (profiled)",
                    timed / n * 1e6, n))

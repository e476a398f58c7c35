-- spec/moe_mlp_spec.lua's allocation count, run under LD_PRELOAD=count_alloc.so: prints the heap
-- allocations of 50 forward + backward steps of an nn.MoEMLP once warm (new routing each step:
-- the input changes), and (the control that the counter counts) of 10 new tensors.
local lutra = require("lutra")
local ffi = require("ffi")
ffi.cdef("unsigned long count_alloc_total(void);")
local count = ffi.C.count_alloc_total

local m = lutra.nn.MoEMLP(16, 24, 4, 2, { seed = 3 })
local xs, dy = {}, lutra.tensor({ 2, 8, 16 }):randn(2)
for i = 1, 4 do xs[i] = lutra.tensor({ 2, 8, 16 }):randn(10 + i) end
for i = 1, 100 do -- warm: every buffer exists, every trace compiled
  m:forward(xs[i % 4 + 1])
  m:backward(dy)
end
local a0 = count()
for i = 1, 50 do
  m:forward(xs[i % 4 + 1])
  m:backward(dy)
end
local a1 = count()
local keep = {}
for i = 1, 10 do keep[i] = lutra.tensor({ 16 }) end
local a2 = count()
print(string.format("step=%d control=%d", a1 - a0, a2 - a1))

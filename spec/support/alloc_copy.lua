-- spec/wrap_spec.lua's allocation count, run under LD_PRELOAD=count_alloc.so: prints the heap
-- allocations of 100 copies of a module's output into a wrapped buffer, of 100 forward + copy
-- steps, and (the control that the counter counts) of 10 new tensors.
local lutra = require("lutra")
local ffi = require("ffi")
ffi.cdef("unsigned long count_alloc_total(void);")
local count = ffi.C.count_alloc_total

local net = lutra.nn.Sequential(lutra.nn.Linear(32, 64), lutra.nn.GELU(), lutra.nn.Linear(64, 16))
local xbuf = ffi.new("float[?]", 8 * 32)
for i = 0, 8 * 32 - 1 do xbuf[i] = math.sin(i) end
local x = lutra.wrap(xbuf, { 8, 32 })
local obuf = ffi.new("float[?]", 8 * 16)
local out = lutra.wrap(obuf, { 8, 16 })
local y = net:forward(x)
out:copy(y) -- warm: every buffer exists, every trace compiled
for _ = 1, 200 do out:copy(net:forward(x)) end

local a0 = count()
for _ = 1, 100 do out:copy(y) end
local a1 = count()
for _ = 1, 100 do out:copy(net:forward(x)) end
local a2 = count()
local keep = {}
for i = 1, 10 do keep[i] = lutra.tensor({ 16 }) end
local a3 = count()
print(string.format("copy=%d step=%d control=%d", a1 - a0, a2 - a1, a3 - a2))
-- the copies landed in the caller's buffer
local ok = true
for i = 0, 8 * 16 - 1 do ok = ok and obuf[i] == y:to_table()[i + 1] end
print(ok and "values ok" or "values differ")

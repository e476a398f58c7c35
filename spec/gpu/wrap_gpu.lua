-- lutra.wrap over a device buffer (a pointer into device memory, 256-byte aligned as cudaMalloc
-- gives): as a module input it gives the bytes an owned input gives, and a module's output copied
-- into it reads back the same; a misaligned device pointer is refused.
local S = require("spec.gpu.support")
local lutra = require("lutra")
local ffi = require("ffi")

describe("lutra.wrap on " .. S.DEV, function()
  S.test(it, "wraps device memory as a module input and a copy destination", function()
    local seed = math.random(1, 2 ^ 30)
    local net = lutra.nn.Sequential(lutra.nn.Linear(64, 128, { seed = seed, device = S.DEV }),
                                    lutra.nn.GELU(),
                                    lutra.nn.Linear(128, 32, { seed = seed + 1, device = S.DEV }))
    local owned = lutra.tensor({ 16, 64 }, "f32", S.DEV)
    owned:randn(seed + 2)
    local want = net:forward(owned):bytes()
    -- device memory lutra did not hand out as a tensor: the buffer of another tensor, wrapped
    local store = lutra.tensor({ 16 * 64 }, "f32", S.DEV)
    store:copy(owned:reshape { 16 * 64 })
    owned:reshape { 16, 64 }
    local x = lutra.wrap(ffi.cast("float *", store.data), { 16, 64 }, "f32",
                         { device = S.DEV, bytes = 16 * 64 * 4 })
    local y = net:forward(x)
    assert.is_true(y:bytes() == want)
    local out_store = lutra.tensor({ 16 * 32 }, "f32", S.DEV)
    out_store:fill(0 / 0)
    local out = lutra.wrap(ffi.cast("float *", out_store.data), { 16, 32 }, "f32",
                           { device = S.DEV, bytes = 16 * 32 * 4 })
    out:copy(y)
    assert.is_true(out_store:bytes() == want)
    local ok, err = pcall(lutra.wrap, ffi.cast("float *", ffi.cast("char *", store.data) + 2), { 4 }, "f32",
                          { device = S.DEV, bytes = 16 })
    assert.is_false(ok)
    assert.matches("aligned", err, 1, true)
  end)
end)

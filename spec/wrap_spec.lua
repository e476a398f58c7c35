-- Caller-owned memory (lutra.wrap / lutra_tensor_wrap): a tensor over an FFI array or a pointer
-- works as a module input, a loss target and a copy destination, in place (the caller's memory
-- sees every write, lutra sees the caller's); copying a module's output into it allocates
-- nothing (counted by an LD_PRELOAD malloc interposer in a subprocess, with a control that the
-- counter counts); bad inputs are refused; freeing the tensor never frees the caller's memory
-- (a malloc'ed buffer stays usable and is freed by the caller, which ASan would flag as a double
-- free otherwise); and a module holding a collected or freed wrapped input refuses its backward.
local lutra = require("lutra")
local ffi = require("ffi")
local nn = lutra.nn
local LUAJIT = os.getenv("LUAJIT") or "luajit"

ffi.cdef [[
void *malloc(size_t n);
void free(void *p);
]]

local function filled(n, seed)
  local a = ffi.new("float[?]", n)
  local t = lutra.tensor { n }
  t:randn(seed)
  local v = t:to_table()
  for i = 0, n - 1 do a[i] = v[i + 1] end
  return a, v
end

describe("lutra.wrap", function()
  it("is a module input, a loss target and a copy destination, in place", function()
    local seed = math.random(1, 2 ^ 30)
    local net = nn.Sequential(nn.Linear(32, 64, { seed = seed }), nn.GELU(),
                              nn.Linear(64, 16, { seed = seed + 1 }))
    local xbuf, xv = filled(8 * 32, seed + 2)
    local tbuf, tv = filled(8 * 16, seed + 3)
    local x, target = lutra.wrap(xbuf, { 8, 32 }), lutra.wrap(tbuf, { 8, 16 })
    local xo, to = lutra.from_table(xv, { 8, 32 }), lutra.from_table(tv, { 8, 16 })
    local loss = nn.MSELoss()
    local y = net:forward(xo)
    local want_y = y:bytes()
    local want_loss = loss:forward(y, to):item()
    local want_dx = net:backward(loss:backward()):bytes()
    y = net:forward(x)
    assert.is_true(y:bytes() == want_y)
    assert.are.equal(want_loss, loss:forward(y, target):item())
    assert.is_true(net:backward(loss:backward()):bytes() == want_dx)
    -- the output copied into the caller's buffer, poisoned first
    local obuf = ffi.new("float[?]", 8 * 16)
    for i = 0, 8 * 16 - 1 do obuf[i] = 0 / 0 end
    local out = lutra.wrap(obuf, { 8, 16 })
    out:copy(y)
    local yv = y:to_table()
    for i = 0, 8 * 16 - 1 do assert.are.equal(yv[i + 1], obuf[i]) end
    -- writes go both ways
    out:fill(2.5)
    assert.are.equal(2.5, obuf[17])
    obuf[3] = -7
    assert.are.equal(-7, out:to_table()[4])
  end)

  it("wraps bf16 and i32 buffers and a pointer with its size", function()
    local b = ffi.new("uint16_t[8]")
    local t = lutra.wrap(b, { 2, 4 }, "bf16")
    t:fill(1.5)
    assert.are.equal(0x3FC0, b[5]) -- bf16 1.5
    local labels = ffi.new("int32_t[4]", { 3, 1, 0, 2 })
    local l = lutra.wrap(labels, { 4 }, "i32")
    local pred = lutra.tensor { 4, 4 }
    pred:randn()
    nn.CrossEntropyLoss():forward(pred, l)
    local keep = ffi.new("float[16]") -- the caller keeps a pointer's memory alive
    local p = ffi.cast("float *", keep)
    local w = lutra.wrap(p, { 4, 4 }, "f32", { bytes = 64 })
    w:fill(3)
    assert.are.equal(3, keep[15])
  end)

  it("refuses bad inputs", function()
    local arr = ffi.new("float[64]")
    local cases = {
      { function() lutra.wrap(ffi.cast("float *", nil), { 4 }) end, "data is NULL" },
      { function() lutra.wrap(ffi.cast("float *", ffi.cast("char *", arr) + 2), { 4 }) end,
        "is not 4-byte aligned" },
      { function() lutra.wrap(arr, { 65 }) end, "the shape needs 260 bytes, the buffer has 256" },
      { function() lutra.wrap(arr, { 2 ^ 40, 2 ^ 40 }) end, "overflows" },
      { function() lutra.wrap(arr, { 0 }) end, "dims must be positive" },
      { function() lutra.wrap(arr, { 4 }, "e4m3") end, "cannot wrap a buffer" },
      { function() lutra.wrap(arr, {}) end, "shape must be a table of 1 to 4 dims" },
      { function() lutra.wrap({}, { 4 }) end, "data must be an FFI array or pointer" },
      { function() lutra.wrap(arr, { 4 }, "f32", { bytes = 16 }) end, "bytes is for pointers" },
      { function() lutra.wrap(ffi.cast("float *", arr), { 8 }, "f32", { bytes = 16 }) end,
        "the shape needs 32 bytes, the buffer has 16" },
    }
    if not lutra.device_available("cuda") then
      cases[#cases + 1] = { function() lutra.wrap(arr, { 4 }, "f32", { device = "cuda" }) end,
                            "lutra_tensor_wrap" }
    end
    for _, c in ipairs(cases) do
      local ok, err = pcall(c[1])
      assert.is_false(ok)
      assert.matches(c[2], tostring(err), 1, true)
    end
    local box = ffi.new("lutra_tensor*[1]")
    local shape = ffi.new("int64_t[1]", 4)
    assert.are_not.equal(0, lutra.C.lutra_tensor_wrap(arr, lutra.C.LUTRA_F32, 1, shape,
                                                        lutra.C.LUTRA_CPU, 16, nil))
    assert.matches("out is NULL", ffi.string(lutra.C.lutra_last_error()), 1, true)
    assert.are_not.equal(0, lutra.C.lutra_tensor_wrap(arr, lutra.C.LUTRA_F32, 5, shape,
                                                        lutra.C.LUTRA_CPU, 16, box))
    assert.are_not.equal(0, lutra.C.lutra_tensor_wrap(arr, lutra.C.LUTRA_F32, 1, nil,
                                                        lutra.C.LUTRA_CPU, 16, box))
  end)

  it("never frees the caller's memory", function()
    local p = ffi.cast("float *", ffi.C.malloc(64 * 4))
    local t = lutra.wrap(p, { 64 }, "f32", { bytes = 256 })
    t:fill(4)
    t:destroy()
    t = nil
    collectgarbage()
    collectgarbage()
    p[63] = 5 -- still the caller's: ASan reports a use after free if lutra freed it
    assert.are.equal(4, p[0])
    ffi.C.free(p) -- and a double free if lutra had freed it
    -- a C-level free of a wrapped tensor too
    local q = ffi.C.malloc(16)
    local box = ffi.new("lutra_tensor*[1]")
    local shape = ffi.new("int64_t[1]", 4)
    assert.are.equal(0, lutra.C.lutra_tensor_wrap(q, lutra.C.LUTRA_F32, 1, shape,
                                                    lutra.C.LUTRA_CPU, 16, box))
    assert.are.equal(0, lutra.C.lutra_tensor_unref(box[0]))
    ffi.cast("float *", q)[3] = 1
    ffi.C.free(q)
  end)

  it("makes a module refuse the backward of a wrapped input freed or collected", function()
    local net = nn.Linear(8, 4)
    local arr = ffi.new("float[16]")
    local x = lutra.wrap(arr, { 2, 8 })
    local y = net:forward(x)
    x:destroy()
    local ok, err = pcall(net.backward, net, y)
    assert.is_false(ok)
    assert.matches("freed", err, 1, true)
    -- collected: the handle and the array unreachable
    local function forward_and_drop()
      local a = ffi.new("float[16]")
      return net:forward(lutra.wrap(a, { 2, 8 }))
    end
    y = forward_and_drop()
    collectgarbage()
    collectgarbage()
    ok, err = pcall(net.backward, net, y)
    assert.is_false(ok)
    assert.matches("freed", err, 1, true)
  end)

  it("copies a module's output into a wrapped buffer without allocating", function()
    local so = os.tmpname() .. ".so"
    assert.are.equal(0, os.execute("cc -shared -fPIC -O1 -o " .. so .. " spec/support/count_alloc.c"))
    -- the plain build of the library (the ASan one would take the allocations from ASan first)
    local lib = io.open("liblutra.so") and "liblutra.so" or error("build liblutra.so (make) first")
    local p = assert(io.popen(string.format("LUTRA_LIB=$PWD/%s LD_PRELOAD=%s %s %s 2>&1", lib, so,
                                            LUAJIT, "spec/support/alloc_copy.lua")))
    local out = p:read("*a")
    p:close()
    os.remove(so)
    local copy, step, control = out:match("copy=(%d+) step=(%d+) control=(%d+)")
    assert.truthy(copy, out)
    assert.are.equal(0, tonumber(copy))
    assert.are.equal(0, tonumber(step))
    assert.is_true(tonumber(control) >= 10, out)
    assert.matches("values ok", out, 1, true)
  end)
end)

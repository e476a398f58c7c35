-- The CPU backend's four-lane f32 loops (src/backend/cpu/cpu.h: lutra_f32x4): ReLU and the bias
-- added after a GEMM must give what the scalar code gave, bit for bit, for every length (the
-- lanes' tail included) and every special value: ReLU keeps x where x > 0 and gives +0 for -0,
-- negatives and NaN; a Linear with zero weights gives its bias exactly on every row.
local lutra = require("lutra")
local nn = lutra.nn
local ffi = require("ffi")
local fresh = require("spec.support.fresh_random")

local rng = fresh.new()

local function bits(t)
  local s = t:bytes()
  local n = #s / 4
  local u = ffi.new("uint32_t[?]", n)
  ffi.copy(u, s, #s)
  return u, n
end

local function f32_bits(v)
  local f = ffi.new("float[1]", v)
  return ffi.cast("uint32_t *", f)[0]
end

describe("the CPU backend's four-lane loops", function()
  local specials = { 0 / 0, -0.0, 0.0, 1 / 0, -1 / 0, 1e-45, -1e-45, 3.4e38, -3.4e38 }

  it("ReLU of every length from 1 to 9 and 4099, special values included", function()
    for _, n in ipairs { 1, 2, 3, 4, 5, 6, 7, 8, 9, 4099 } do
      local vals = {}
      for i = 1, n do vals[i] = (rng.int(0, 2000) - 1000) / 37 end
      for _ = 1, math.min(n, 4) do vals[rng.int(1, n)] = specials[rng.int(1, #specials)] end
      local x = lutra.tensor({ 1, n })
      x:set(vals)
      local y = nn.ReLU():forward(x, { grad = false })
      local got = bits(y)
      local xs = x:to_table()
      for i = 1, n do
        local v = xs[i]
        local want = v > 0 and f32_bits(v) or 0 -- +0 for NaN, -0 and negatives
        assert.are.equal(want, got[i - 1], string.format("seed %d, n %d, element %d (%s)",
                                                         rng.seed, n, i, tostring(v)))
      end
    end
  end)

  it("a Linear's bias on every row, for widths 1 to 9 (the add's tail)", function()
    for n = 1, 9 do
      local lin = nn.Linear(3, n)
      local p = lin:parameters()
      p[1].value:fill(0)
      p[2].value:randn(rng.int(1, 2 ^ 30))
      local rows = rng.int(1, 5)
      local y = lin:forward(lutra.tensor({ rows, 3 }):randn(rng.int(1, 2 ^ 30)), { grad = false })
      local got = bits(y)
      local b = bits(p[2].value)
      for r = 0, rows - 1 do
        for j = 0, n - 1 do
          assert.are.equal(b[j], got[r * n + j], string.format("seed %d, width %d, row %d", rng.seed,
                                                               n, r))
        end
      end
    end
  end)
end)

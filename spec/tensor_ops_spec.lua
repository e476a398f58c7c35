-- The tensor operations (lua/lutra/tensor_ops.lua, src/lutra/tensor_ops.h) on the CPU against
-- references computed here in Lua on fresh random data: add_, scale_, lutra.add (exact: one f32
-- rounding, then one into bf16/f16, which the reference does by the library's own tested
-- conversion), views of rows (no copy, the base kept alive), select (exact copies), argmax
-- (exact), softmax (within 1e-6 of a double reference) and the seeded sampler (the same ids as
-- a Lua implementation of its definition, with the same uniform numbers), edge cases and bad
-- input refused with the call named.
local lutra = require("lutra")
local ffi = require("ffi")
local f32 = require("spec.support.f32")
local E = require("spec.support.errors")

local seed = os.time()
local function rand(shape, s, dtype) return lutra.tensor(shape, dtype):randn(s) end
-- v rounded into dtype through the library's conversion (RNE, tested in spec/dtype_spec.lua)
local function round_to(vals, dtype)
  if dtype == "f32" then return vals end
  return lutra.from_table(vals, { #vals }, dtype):to_table()
end

describe("add_, scale_ and lutra.add", function()
  for _, dtype in ipairs { "f32", "bf16", "f16" } do
    it("computes a + alpha b with one rounding (" .. dtype .. ")", function()
      local a, b = rand({ 7, 33 }, seed, dtype), rand({ 7, 33 }, seed + 1, dtype)
      local alpha = f32(0.1 + math.random())
      local ta, tb = a:to_table(), b:to_table()
      local want = {}
      for i = 1, #ta do want[i] = f32(ta[i] + f32(alpha * tb[i])) end
      want = round_to(want, dtype)
      a:add_(b, alpha)
      assert.are.same(want, a:to_table())
      local s = f32(-0.5 - math.random())
      local scaled = {}
      for i, v in ipairs(want) do scaled[i] = f32(s * v) end
      assert.are.same(round_to(scaled, dtype), a:scale_(s):to_table())
      local sum = {}
      local ta2 = a:to_table()
      for i = 1, #ta2 do sum[i] = f32(ta2[i] + tb[i]) end
      assert.are.same(round_to(sum, dtype), lutra.add(a, b):to_table())
    end)
  end

  it("writes into out, which may be an input, and refuses mismatches", function()
    local a, b = rand({ 4, 5 }, seed), rand({ 4, 5 }, seed + 1)
    local want = lutra.add(a, b):to_table()
    assert.are.equal(b, lutra.add(a, b, b))
    assert.are.same(want, b:to_table())
    E.expect_error(function() lutra.add(a, lutra.tensor({ 5, 4 })) end, "lutra_add_scaled",
                   "different shapes")
    E.expect_error(function() lutra.add(a, lutra.tensor({ 4, 5 }, "bf16")) end,
                   "lutra_add_scaled", "dtypes differ")
    E.expect_error(function() a:add_(lutra.tensor({ 4, 5 }, "i32")) end, "lutra_add_scaled",
                   "b dtype i32 is not f32")
    E.expect_error(function() a:add_(3) end, "tensor:add_", "other must be a tensor")
    E.expect_error(function() a:scale_(0 / 0) end, "tensor:scale_", "finite")
    E.expect_error(function() lutra.add(a, nil) end, "lutra.add", "b must be a tensor")
  end)
end)

describe("rows and select", function()
  it("rows is a view: the same memory, writes visible both ways", function()
    local t = rand({ 6, 3, 2 }, seed)
    local v = t:rows(2, 3)
    assert.are.same({ 3, 3, 2 }, v:dims())
    local tt = t:to_table()
    local vv = v:to_table()
    for i = 1, 18 do assert.are.equal(tt[6 + i], vv[i]) end
    v:fill(7)
    local after = t:to_table()
    for i = 1, 36 do assert.are.equal((i > 6 and i <= 24) and 7 or tt[i], after[i]) end
    -- a view of a view reads the same buffer; i32 tensors have views too
    assert.are.same({ 7, 7, 7, 7, 7, 7 }, v:rows(3):to_table())
    local ids = lutra.from_table({ 1, 2, 3, 4 }, { 4 }, "i32")
    assert.are.same({ 3, 4 }, ids:rows(3, 2):to_table())
  end)

  it("keeps its base's buffer alive (GC, destroy, a module's new buffer)", function()
    local t = rand({ 4, 8 }, seed)
    local want = t:to_table()
    local v = t:rows(1, 4)
    t = nil -- luacheck: ignore
    collectgarbage()
    collectgarbage()
    assert.are.same(want, v:to_table())
    local base = rand({ 3, 2 }, seed)
    local w = base:rows(2, 2)
    local kept = w:to_table()
    base:destroy()
    assert.is_true(base:is_freed())
    assert.are.same(kept, w:to_table()) -- the buffer stayed for the view
    E.expect_error(function() base:rows(1) end, "lutra_tensor_view_rows", "was freed")
    -- a module's output, replaced by a forward of a new shape: the view reads the old buffer
    local lin = lutra.nn.Linear(3, 2)
    local y = lin:forward(rand({ 4, 3 }, seed))
    local yv = y:rows(1, 2)
    local old = yv:to_table()
    lin:forward(rand({ 5, 3 }, seed + 1))
    collectgarbage()
    assert.are.same(old, yv:to_table())
  end)

  it("re-points a view in place (no new tensor) and refuses rows out of range", function()
    local t = rand({ 5, 2 }, seed)
    local tt = t:to_table()
    local v = t:rows(1)
    for r = 1, 5 do
      assert.are.equal(v, t:rows(r, 1, v))
      assert.are.same({ tt[2 * r - 1], tt[2 * r] }, v:to_table())
    end
    -- a view re-pointed at rows of itself
    local wide = t:rows(2, 4)
    assert.are.same({ tt[5], tt[6] }, wide:rows(2, 1, wide):to_table())
    local other = rand({ 2, 2 }, seed + 1)
    assert.are.same(other:to_table(), t:rows(1, 1, v) and other:rows(1, 2, v):to_table())
    E.expect_error(function() t:rows(5, 2) end, "lutra_tensor_view_rows",
                   "outside the tensor's 5 rows")
    E.expect_error(function() t:rows(0) end, "tensor:rows", "first must be a positive integer")
    E.expect_error(function() t:rows(1, 1, t) end, "lutra_tensor_view_rows_into", "not a view")
  end)

  it("select copies one index of a dim (the last position of each sequence)", function()
    local B, T, Cc = 3, 5, 4
    local h = rand({ B, T, Cc }, seed)
    local hv = h:to_table()
    local at = function(b, t, c) return hv[((b - 1) * T + (t - 1)) * Cc + c] end
    local last = h:select(2, T)
    assert.are.same({ B, Cc }, last:dims())
    local want = {}
    for b = 1, B do for c = 1, Cc do want[#want + 1] = at(b, T, c) end end
    assert.are.same(want, last:to_table())
    local out = lutra.tensor({ T, Cc })
    assert.are.equal(out, h:select(1, 2, out))
    want = {}
    for t = 1, T do for c = 1, Cc do want[#want + 1] = at(2, t, c) end end
    assert.are.same(want, out:to_table())
    want = {}
    for b = 1, B do for t = 1, T do want[#want + 1] = at(b, t, 3) end end
    assert.are.same(want, h:select(3, 3):to_table())
    assert.are.same({ 30 }, lutra.from_table({ 10, 20, 30 }, { 3 }, "i32"):select(1, 3):to_table())
    E.expect_error(function() h:select(2, T + 1) end, "lutra_tensor_select", "index 5 is outside")
    E.expect_error(function() h:select(4, 1) end, "tensor:select",
                   "dim must be one of the tensor's dims 1..3 (got 4)")
    E.expect_error(function() h:select(2, 1, lutra.tensor({ B, Cc + 1 })) end,
                   "lutra_tensor_select", "out must have the tensor's shape without dim 1")
    E.expect_error(function() h:select(2, 1, lutra.tensor({ B, Cc }, "bf16")) end,
                   "lutra_tensor_select", "out must have the tensor's dtype")
  end)
end)

-- ---- the row reductions' references ----
local function rows_of(x)
  local d = x:dims()
  return x:size() / d[#d], d[#d]
end

local function ref_argmax(vals, rows, cols)
  local out = {}
  for r = 0, rows - 1 do
    local best, bi = nil, 0
    for j = 0, cols - 1 do
      local v = vals[r * cols + j + 1]
      if v == v and (best == nil or v > best) then best, bi = v, j end
    end
    out[r + 1] = bi
  end
  return out
end

-- lutra_sample_uniform (src/backend/tensor_ops_math.h) in Lua's uint64 arithmetic
local function uniform(s, row)
  local z = ffi.new("uint64_t", s) + ffi.new("uint64_t", row + 1) * 0x9E3779B97F4A7C15ULL
  z = bit.bxor(z, bit.rshift(z, 30)) * 0xBF58476D1CE4E5B9ULL
  z = bit.bxor(z, bit.rshift(z, 27)) * 0x94D049BB133111EBULL
  z = bit.bxor(z, bit.rshift(z, 31))
  return tonumber(bit.rshift(z, 40)) / 16777216
end

-- the sampler's definition: keep logits >= the k-th largest, w = exp(x/T - max), the first id
-- whose running sum (f64, index order, as the CPU) passes u * sum
local function ref_sample(vals, rows, cols, T, k, s)
  local out = {}
  for r = 0, rows - 1 do
    local row = {}
    for j = 1, cols do row[j] = vals[r * cols + j] end
    local sorted = { unpack(row) }
    table.sort(sorted, function(a, b) return a > b end)
    local kth = (k > 0 and k < cols) and sorted[k] or -math.huge
    local m = -math.huge
    for j = 1, cols do if row[j] >= kth then m = math.max(m, f32(row[j] / T)) end end
    local w, sum = {}, 0
    for j = 1, cols do
      w[j] = row[j] >= kth and f32(math.exp(f32(f32(row[j] / T) - m))) or 0
      sum = sum + w[j]
    end
    local target, acc, pick = uniform(s, r) * sum, 0, nil
    for j = 1, cols do
      if row[j] >= kth then
        pick = j - 1
        acc = acc + w[j]
        if acc > target then break end
      end
    end
    out[r + 1] = pick
  end
  return out
end

describe("argmax, softmax and sample", function()
  it("argmax: the first largest of each row, NaNs ignored", function()
    for _, dtype in ipairs { "f32", "bf16" } do
      local x = rand({ 2, 3, 17 }, seed, dtype)
      local rows, cols = rows_of(x)
      local ids = x:argmax()
      assert.are.same({ 2, 3 }, ids:dims())
      assert.are.same(ref_argmax(x:to_table(), rows, cols), ids:to_table())
    end
    local nan = 0 / 0
    local x = lutra.from_table({ 1, 3, 3, 2, nan, nan, nan, nan, nan, -1, nan, -1 }, { 3, 4 })
    assert.are.same({ 1, 0, 1 }, x:argmax():to_table())
    assert.are.same({ 0 }, lutra.from_table({ 5 }):argmax():to_table())
  end)

  it("softmax: within 1e-6 of a double reference, with a temperature, into out", function()
    local x = rand({ 6, 50 }, seed)
    local rows, cols = rows_of(x)
    for _, T in ipairs { 1, 0.5, 3 } do
      local out = lutra.tensor({ 6, 50 })
      assert.are.equal(out, x:softmax { temperature = T, out = out })
      local v, p = x:to_table(), out:to_table()
      for r = 0, rows - 1 do
        local m, s = -math.huge, 0
        for j = 1, cols do m = math.max(m, v[r * cols + j] / T) end
        for j = 1, cols do s = s + math.exp(v[r * cols + j] / T - m) end
        for j = 1, cols do
          local want = math.exp(v[r * cols + j] / T - m) / s
          assert.is_true(math.abs(p[r * cols + j] - want) <= 1e-6, "softmax element")
        end
      end
    end
    assert.are.equal("bf16", lutra.softmax(rand({ 2, 4 }, seed, "bf16")):dtype_name())
  end)

  it("sample: the ids of its definition, for a seed; top_k keeps the k largest", function()
    local x = rand({ 40, 30 }, seed)
    local rows, cols = rows_of(x)
    local vals = x:to_table()
    for _, case in ipairs { { 1, 0 }, { 0.7, 5 }, { 2, 1 }, { 1.3, 29 }, { 1, 30 } } do
      local T, k = case[1], case[2]
      local s = seed + k
      local ids = lutra.sample(x, { temperature = T, top_k = k, seed = s })
      assert.are.same(ref_sample(vals, rows, cols, T, k, s), ids:to_table(),
                      string.format("temperature %g, top_k %d", T, k))
      assert.are.same(ids:to_table(), x:sample { temperature = T, top_k = k, seed = s }:to_table())
    end
    assert.are.same(x:argmax():to_table(), x:sample { top_k = 1, seed = 3 }:to_table())
    assert.are.same(x:argmax():to_table(), x:sample { temperature = 0 }:to_table())
    -- ties at the k-th largest are all kept: ids 1 and 2 tie for the 2nd place
    local tie = lutra.tensor({ 300, 4 })
    local tv = {}
    for r = 1, 300 do tv[#tv + 1], tv[#tv + 2], tv[#tv + 3], tv[#tv + 4] = 1, 0.5, 0.5, -3 end
    tie:set(tv)
    local seen = {}
    for _, id in ipairs(tie:sample { top_k = 2, seed = seed }:to_table()) do seen[id] = true end
    assert.is_true(seen[0] and seen[1] and seen[2] and not seen[3])
  end)

  it("sample: frequencies follow the probabilities (many rows of one distribution)", function()
    local N, logits = 4000, { 0.0, 1.0, -1.0, 2.0, 0.5 }
    local x = lutra.tensor({ N, 5 })
    local v = {}
    for r = 1, N do for j = 1, 5 do v[#v + 1] = logits[j] end end
    x:set(v)
    local counts = { 0, 0, 0, 0, 0 }
    for _, id in ipairs(x:sample { seed = seed }:to_table()) do
      counts[id + 1] = counts[id + 1] + 1
    end
    local s = 0
    for j = 1, 5 do s = s + math.exp(logits[j]) end
    for j = 1, 5 do
      local p = math.exp(logits[j]) / s
      -- 5 standard deviations of a binomial count: a false failure is ~1e-6 per id
      assert.is_true(math.abs(counts[j] / N - p) <= 5 * math.sqrt(p * (1 - p) / N),
                     string.format("id %d: %d draws for p %.3f", j - 1, counts[j], p))
    end
  end)

  it("unseeded draws come from the global generator (lutra.manual_seed repeats them)", function()
    local x = rand({ 50, 20 }, seed)
    lutra.manual_seed(seed)
    local a = x:sample():to_table()
    lutra.manual_seed(seed)
    assert.are.same(a, x:sample():to_table())
  end)

  it("refuses bad input naming the call", function()
    local x = rand({ 4, 6 }, seed)
    E.expect_error(function() x:argmax(lutra.tensor({ 4 })) end, "lutra_argmax",
                   "ids dtype f32 is not i32")
    E.expect_error(function() x:argmax(lutra.tensor({ 5 }, "i32")) end, "lutra_argmax",
                   "ids must have x's leading dims")
    E.expect_error(function() x:softmax { temperature = -1 } end, "lutra_softmax",
                   "temperature must be a finite number > 0")
    E.expect_error(function() x:softmax { out = lutra.tensor({ 4, 5 }) } end, "lutra_softmax",
                   "different shapes")
    E.expect_error(function() x:sample { top_k = -1 } end, "tensor:sample", "top_k")
    E.expect_error(function() x:sample { temperature = 0 / 0 } end, "tensor:sample",
                   "temperature must be a finite number")
    E.expect_error(function() x:sample { seed = -2 } end, "tensor:sample", "seed")
    E.expect_error(function() x:sample { topk = 3 } end, "tensor:sample", "unknown option 'topk'")
    E.expect_error(function() lutra.sample(nil) end, "lutra.sample", "logits must be a tensor")
    E.expect_error(function() lutra.from_table({ 1, 2 }, { 2 }, "i32"):argmax() end,
                   "lutra_argmax", "x dtype i32 is not f32")
  end)
end)

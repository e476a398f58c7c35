-- nn.RotaryEmbedding on the CPU backend (the reference; spec/gpu/rope_gpu.lua compares CUDA to
-- it), against an f64 rotation written here in Lua (angle p * base^(-2i/r), p = offset + t).
--   f32: |got - ref| <= 2^-22 (|x0| + |x1|) per rotated element: cos and sin are rounded to f32
--        (2^-24 relative each), the two products and their sum round once each (2^-24 of each
--        term), so the error is at most 3 * 2^-24 (|x0| + |x1|), within 4 * 2^-24;
--   bf16 / f16: the same plus the one rounding of the result to the dtype, half an ulp: 2^-8 /
--        2^-11 of |ref| (the inputs are values of the dtype, exact in f32), plus 2^-24 absolute
--        for f16's subnormals;
--   pass-through elements (rotary_dim < head_dim) are the input's bits.
-- The backward is the inverse rotation (checked against the f64 rotation by -angle and against
-- central finite differences of a weighted sum: the rotation is linear, so h = 0.5 has no
-- truncation error); apply_qkv equals the module's forward of q and k cut out of the packed
-- buffer, bit for bit, and leaves v's bits alone.
local lutra = require("lutra")
local nn = lutra.nn
local E = require("spec.support.errors")

-- fresh random values each run, the seed named in the failures
local G = require("spec.support.fresh_random").new()
local SEED, random = G.seed, G.int
local function seed() return random(1, 2 ^ 30) end

local BOUND = { f32 = 0, bf16 = 2 ^ -8, f16 = 2 ^ -11 }

-- 1-based index of element (b, t, h, d) (0-based) of a [B, T, H, D] (bshd) or [T, B, H, D]
-- (sbhd) tensor whose tokens are width elements apart, its heads starting at head0
local function indexer(fmt, B, T, width, D, head0)
  head0 = head0 or 0
  if fmt == "sbhd" then
    return function(b, t, h, d) return (t * B + b) * width + (head0 + h) * D + d + 1 end
  end
  return function(b, t, h, d) return (b * T + t) * width + (head0 + h) * D + d + 1 end
end

-- the f64 rotation of x's values (a Lua array) at the elements at(b, t, h, d) reaches, into
-- ref[at(...)] with mag[...] = |x0| + |x1| (nil for pass-through elements)
local function reference(x, at, o)
  local ref, mag = {}, {}
  local half = o.rotary_dim / 2
  local sign = o.inverse and -1 or 1
  for b = 0, o.B - 1 do
    for t = 0, o.T - 1 do
      for h = 0, o.H - 1 do
        for i = 0, half - 1 do
          local j0, j1 = i, i + half
          if o.interleaved then j0, j1 = 2 * i, 2 * i + 1 end
          local a = (o.offset + t) * o.base ^ (-2 * i / o.rotary_dim)
          local c, s = math.cos(a), sign * math.sin(a)
          local k0, k1 = at(b, t, h, j0), at(b, t, h, j1)
          local x0, x1 = x[k0], x[k1]
          ref[k0], ref[k1] = x0 * c - x1 * s, x1 * c + x0 * s
          mag[k0], mag[k1] = math.abs(x0) + math.abs(x1), math.abs(x0) + math.abs(x1)
        end
        for d = o.rotary_dim, o.D - 1 do
          local k = at(b, t, h, d)
          ref[k] = x[k]
        end
      end
    end
  end
  return ref, mag
end

-- got (a Lua array) against reference(): within the bounds above, pass-through exact
local function assert_rotation(got, ref, mag, dtype, what)
  local rel = BOUND[dtype]
  for k, want in pairs(ref) do
    local g = got[k]
    local subnormal = dtype == "f16" and 2 ^ -24 or 0
    local tol = mag[k] and (2 ^ -22 * mag[k] + rel * math.abs(want) + subnormal) or 0
    if not (math.abs(g - want) <= tol) then
      error(string.format("%s: element %d is %.9g, f64 reference %.9g (tolerance %.3g, seed %d)",
                          what, k, g, want, tol, SEED), 2)
    end
  end
end

-- back (the inverse rotation of the rotation of x, f32) within two rotations' error: 3 * 2^-24
-- (|x0| + |x1|) each, bounded by 2^-20 max|x|
local function assert_round_trip(back, x)
  local xv, bv, max = x:to_table(), back:to_table(), 0
  for _, v in ipairs(xv) do max = math.max(max, math.abs(v)) end
  for k, v in ipairs(xv) do
    if not (math.abs(bv[k] - v) <= 2 ^ -20 * max) then
      error(string.format("element %d is %.9g after the round trip, was %.9g (seed %d)", k, bv[k],
                          v, SEED), 2)
    end
  end
end

local function opts_of(o)
  return { rotary_dim = o.rotary_dim, base = o.base, interleaved = o.interleaved,
           qkv_format = o.fmt, dtype = o.dtype, max_seq = o.max_seq }
end

local function shape_of(o, heads, D)
  if o.fmt == "sbhd" then return { o.T, o.B, heads, D } end
  return { o.B, o.T, heads, D }
end

-- the cases: formats, partial rotation, interleaving, offsets, T of no particular multiple
local CASES = {
  { fmt = "bshd", B = 2, T = 7, H = 3, D = 8, rotary_dim = 8, base = 10000, offset = 0 },
  { fmt = "sbhd", B = 3, T = 5, H = 2, D = 16, rotary_dim = 16, base = 10000, offset = 0 },
  { fmt = "bshd", B = 1, T = 13, H = 2, D = 12, rotary_dim = 6, base = 10000, offset = 0 },
  { fmt = "sbhd", B = 2, T = 9, H = 1, D = 10, rotary_dim = 4, base = 500, offset = 17 },
  { fmt = "bshd", B = 2, T = 11, H = 2, D = 8, rotary_dim = 8, base = 10000, offset = 3000,
    interleaved = true },
  { fmt = "bshd", B = 1, T = 1, H = 4, D = 64, rotary_dim = 32, base = 1e6, offset = 4095 },
}

local function describe_case(o)
  return string.format("%s B%d T%d H%d D%d r%d base %g offset %d%s %s", o.fmt, o.B, o.T, o.H, o.D,
                       o.rotary_dim, o.base, o.offset, o.interleaved and " interleaved" or "",
                       o.dtype)
end

describe("nn.RotaryEmbedding", function()
  for _, dtype in ipairs { "f32", "bf16", "f16" } do
    for _, c in ipairs(CASES) do
      local o = setmetatable({ dtype = dtype }, { __index = c })
      local name = describe_case(o)
      it("forward and backward match the f64 rotation: " .. name, function()
        local m = nn.RotaryEmbedding(o.D, opts_of(o))
        m:set_offset(o.offset)
        local x = lutra.tensor(shape_of(o, o.H, o.D), dtype):randn(seed())
        local xv = x:to_table()
        local at = indexer(o.fmt, o.B, o.T, o.H * o.D, o.D)
        local y = m:forward(x)
        assert.are.same(x:dims(), y:dims())
        local ref, mag = reference(xv, at, o)
        assert_rotation(y:to_table(), ref, mag, dtype, name .. " forward")
        -- the backward rotates by -angle at the forward's positions, whatever the offset is now
        m:set_offset(0)
        local dy = lutra.tensor(shape_of(o, o.H, o.D), dtype):randn(seed())
        local dx = m:backward(dy)
        local inv = setmetatable({ inverse = true }, { __index = o })
        local dref, dmag = reference(dy:to_table(), at, inv)
        assert_rotation(dx:to_table(), dref, dmag, dtype, name .. " backward")
      end)
    end
  end

  it("backward of forward gives the input back (f32: two rotations' error)", function()
    local m = nn.RotaryEmbedding(32, { rotary_dim = 24 })
    m:set_offset(random(0, 2000))
    local x = lutra.tensor({ 3, 17, 4, 32 }):randn(seed())
    assert_round_trip(m:backward(m:forward(x)), x)
  end)

  it("backward equals central finite differences of a weighted sum", function()
    local o = { fmt = "bshd", B = 2, T = 5, H = 2, D = 8, rotary_dim = 6, base = 10000 }
    local m = nn.RotaryEmbedding(o.D, opts_of(o))
    m:set_offset(random(0, 100))
    local shape = shape_of(o, o.H, o.D)
    local x = lutra.tensor(shape):randn(seed())
    local w = lutra.tensor(shape):randn(seed())
    local xv, wv = x:to_table(), w:to_table()
    m:forward(x)
    local g = m:backward(w):to_table()
    local function loss()
      local y, s = m:forward(lutra.from_table(xv, shape)):to_table(), 0
      for k = 1, #y do s = s + wv[k] * y[k] end
      return s
    end
    local h = 0.5 -- the loss is linear in x: no truncation error, so a large step is exact
    for _ = 1, 24 do
      local k = random(1, #xv)
      local v = xv[k]
      xv[k] = v + h
      local lp = loss()
      xv[k] = v - h
      local lm = loss()
      xv[k] = v
      local num = (lp - lm) / (2 * h)
      assert.is_true(math.abs(num - g[k]) <= 1e-5 * (1 + math.abs(num)),
                     string.format("dx[%d] = %.9g, finite differences %.9g (seed %d)", k, g[k],
                                   num, SEED))
    end
  end)

  it("positions: a forward at offset k equals rows k.. of a longer sequence, bit for bit",
     function()
    local m = nn.RotaryEmbedding(16, { max_seq = 64 })
    local long = lutra.tensor({ 2, 40, 3, 16 }):randn(seed())
    local full = m:forward(long):to_table()
    local k, T = random(1, 30), 7
    local lv, part = long:to_table(), {}
    local at_long, at_part = indexer("bshd", 2, 40, 48, 16), indexer("bshd", 2, T, 48, 16)
    for b = 0, 1 do
      for t = 0, T - 1 do
        for h = 0, 2 do
          for d = 0, 15 do part[at_part(b, t, h, d)] = lv[at_long(b, k + t, h, d)] end
        end
      end
    end
    m:set_offset(k)
    local got = m:forward(lutra.from_table(part, { 2, T, 3, 16 })):to_table()
    for b = 0, 1 do
      for t = 0, T - 1 do
        for h = 0, 2 do
          for d = 0, 15 do
            assert.are.equal(full[at_long(b, k + t, h, d)], got[at_part(b, t, h, d)])
          end
        end
      end
    end
    assert.are.equal(k, m:settings().offset)
  end)

  for _, fmt in ipairs { "bshd", "sbhd" } do
    for _, dtype in ipairs { "f32", "bf16" } do
      it("apply_qkv rotates q and k as forward does and leaves v's bits: " .. fmt .. " " .. dtype,
         function()
        local B, T, H, G, D = 2, 7, 4, 2, 8
        local heads = H + 2 * G
        local m = nn.RotaryEmbedding(D, { rotary_dim = 6, qkv_format = fmt, dtype = dtype })
        m:set_offset(random(0, 50))
        local o = { fmt = fmt, B = B, T = T }
        for _, ndim in ipairs { 3, 4 } do
          local shape = shape_of(o, heads, D)
          if ndim == 3 then shape = { shape[1], shape[2], heads * D } end
          local qkv = lutra.tensor(shape, dtype):randn(seed())
          local before = qkv:to_table()
          -- q and k cut out of the packed buffer, through the module's forward
          local function part(head0, n)
            local at, cut = indexer(fmt, B, T, heads * D, D, head0), {}
            local at_cut = indexer(fmt, B, T, n * D, D)
            for b = 0, B - 1 do
              for t = 0, T - 1 do
                for h = 0, n - 1 do
                  for d = 0, D - 1 do cut[at_cut(b, t, h, d)] = before[at(b, t, h, d)] end
                end
              end
            end
            local y = m:forward(lutra.from_table(cut, shape_of(o, n, D), dtype)):to_table()
            return y, at, at_cut
          end
          local q, at_q, at_cut_q = part(0, H)
          local k, at_k, at_cut_k = part(H, G)
          assert.are.equal(qkv, m:apply_qkv(qkv, H, G))
          local after = qkv:to_table()
          local at_v = indexer(fmt, B, T, heads * D, D, H + G)
          for b = 0, B - 1 do
            for t = 0, T - 1 do
              for d = 0, D - 1 do
                for h = 0, H - 1 do
                  assert.are.equal(q[at_cut_q(b, t, h, d)], after[at_q(b, t, h, d)])
                end
                for h = 0, G - 1 do
                  assert.are.equal(k[at_cut_k(b, t, h, d)], after[at_k(b, t, h, d)])
                  assert.are.equal(before[at_v(b, t, h, d)], after[at_v(b, t, h, d)])
                end
              end
            end
          end
          -- the inverse gives q and k back (f32 within 2^-20; bf16 within two roundings)
          m:apply_qkv(qkv, H, G, true)
          local tol = dtype == "f32" and 2 ^ -20 or 2 ^ -6
          for idx, v in ipairs(qkv:to_table()) do
            assert.is_true(math.abs(v - before[idx]) <= tol * (1 + math.abs(before[idx])),
                           string.format("element %d: %.9g, was %.9g", idx, v, before[idx]))
          end
        end
      end)
    end
  end

  it("takes part in a Sequential, and its checkpoints (no state of its own)", function()
    local function net(s)
      return nn.Sequential(nn.RotaryEmbedding(8), nn.Linear(8, 8, { seed = s }))
    end
    local a, b = net(seed()), net(seed())
    local x = lutra.tensor({ 2, 3, 2, 8 }):randn(seed())
    local dx = a:backward(a:forward(x))
    assert.are.same(x:dims(), dx:dims())
    local path = os.tmpname()
    lutra.save(path, { model = a })
    lutra.load(path, { model = b })
    os.remove(path)
    assert.are.equal(a:forward(x):bytes(), b:forward(x):bytes())
  end)

  it("prints its settings", function()
    assert.are.equal("lutra.nn.RotaryEmbedding(head_dim=64, rotary_dim=32, base=500, interleaved, "
                     .. "sbhd, bf16, cpu)",
                     tostring(nn.RotaryEmbedding(64, { rotary_dim = 32, base = 500,
                                                       interleaved = true, qkv_format = "sbhd",
                                                       dtype = "bf16" })))
    local s = nn.RotaryEmbedding(8):settings()
    assert.are.same({ head_dim = 8, rotary_dim = 8, base = 10000, max_seq = 4096,
                      interleaved = false, qkv_format = "bshd", dtype = "f32", device = "cpu",
                      offset = 0 }, s)
    assert.are.equal(0, #nn.RotaryEmbedding(8):parameters())
  end)

  describe("refuses bad input with a clear error and changes nothing", function()
    local new = "lutra_rope_new"
    it("at construction", function()
      E.expect_error(function() nn.RotaryEmbedding(7) end, new, "head_dim 7 must be even")
      E.expect_error(function() nn.RotaryEmbedding(8, { rotary_dim = 5 }) end, new,
                     "rotary_dim 5 must be even")
      E.expect_error(function() nn.RotaryEmbedding(8, { rotary_dim = 10 }) end, new,
                     "rotary_dim 10 must be even, 2 .. head_dim 8")
      E.expect_error(function() nn.RotaryEmbedding(8, { base = 1 }) end, new, "base 1 must be")
      E.expect_error(function() nn.RotaryEmbedding(8, { dtype = "e4m3" }) end, new,
                     "dtype e4m3 is not f32, bf16 or f16")
      E.expect_error(function() nn.RotaryEmbedding(8, { qkv_format = "bhsd" }) end,
                     "lutra.nn.RotaryEmbedding", "qkv_format")
      E.expect_error(function() nn.RotaryEmbedding(8, { rope = true }) end,
                     "lutra.nn.RotaryEmbedding", "rope")
    end)

    it("at forward, backward and apply_qkv", function()
      local m = nn.RotaryEmbedding(8, { max_seq = 16 })
      local fwd, bwd, qkv_call = "lutra_rope_forward", "lutra_rope_backward", "lutra_rope_apply_qkv"
      E.expect_error(function() m:backward(lutra.tensor({ 1, 2, 1, 8 })) end, bwd,
                     "backward called before forward")
      local x = lutra.tensor({ 2, 5, 3, 8 }):randn(seed())
      local y = m:forward(x)
      local y_bits = y:bytes()
      E.expect_error(function() m:forward(lutra.tensor({ 2, 5, 3, 6 })) end, fwd,
                     "input must be [B, T, H, 8]")
      E.expect_error(function() m:forward(lutra.tensor({ 10, 24 })) end, fwd,
                     "input must be [B, T, H, 8]")
      E.expect_error(function() m:forward(lutra.tensor({ 2, 5, 3, 8 }, "bf16")) end, fwd,
                     "input dtype bf16 does not match the module's f32")
      E.expect_error(function() m:forward(lutra.tensor({ 1, 17, 1, 8 })) end, fwd,
                     "positions 0 .. 16 (offset 0 + T 17) pass max_seq 16")
      m:set_offset(12)
      E.expect_error(function() m:forward(lutra.tensor({ 1, 5, 1, 8 })) end, fwd,
                     "positions 12 .. 16 (offset 12 + T 5) pass max_seq 16")
      E.expect_error(function() m:set_offset(16) end, "lutra_rope_set_offset",
                     "offset 16 is outside 0 .. max_seq 16 - 1")
      E.expect_error(function() m:set_offset(-1) end, "lutra_rope_set_offset", "offset -1")
      E.expect_error(function() m:set_offset("1") end, "rope:set_offset", "offset must be")
      E.expect_error(function() m:backward(lutra.tensor({ 2, 5, 3, 6 })) end, bwd,
                     "grad_output must be [B, T, H, 8]")
      E.expect_error(function() m:backward(lutra.tensor({ 2, 4, 3, 8 })) end, bwd,
                     "grad_output shape does not match the forward output")
      E.expect_error(function() m:backward(lutra.tensor({ 2, 5, 3, 8 }, "f16")) end, bwd,
                     "grad_output dtype f16")
      -- the failed calls left the last forward as it was: its output and its backward
      assert.are.equal(y_bits, y:bytes())
      m:set_offset(0)
      assert_round_trip(m:backward(y), x)

      local qkv = lutra.tensor({ 2, 5, 8 * 8 }):randn(seed())
      local bits = qkv:bytes()
      E.expect_error(function() m:apply_qkv(qkv, 4, 3) end, qkv_call,
                     "num_gqa_groups 3 must divide num_heads 4")
      E.expect_error(function() m:apply_qkv(qkv, 4, 0) end, qkv_call, "num_gqa_groups 0")
      E.expect_error(function() m:apply_qkv(qkv, 4, 1) end, qkv_call,
                     "qkv must be [B, T, 48] or [B, T, 6, 8]")
      E.expect_error(function() m:apply_qkv(lutra.tensor({ 2, 5, 64 }, "bf16"), 4, 2) end,
                     qkv_call, "qkv dtype bf16")
      E.expect_error(function() m:apply_qkv(lutra.tensor({ 1, 17, 64 }), 4, 2) end, qkv_call,
                     "pass max_seq 16")
      E.expect_error(function() m:apply_qkv(qkv, 4.5, 2) end, "rope:apply_qkv", "num_heads must be")
      E.expect_error(function() m:apply_qkv({}, 4, 2) end, "rope:apply_qkv", "qkv must be a tensor")
      E.expect_error(function() m:apply_qkv(qkv, 4, 2, 1) end, "rope:apply_qkv",
                     "inverse must be a boolean")
      assert.are.equal(bits, qkv:bytes())
      -- a Linear is not a RotaryEmbedding
      E.expect_error(function() E.c_check(lutra.C.lutra_rope_set_offset(nn.Linear(2, 2), 0)) end,
                     "lutra_rope_set_offset", "not a rotary_embedding")
    end)

    it("an inference forward keeps nothing for a backward", function()
      local m = nn.RotaryEmbedding(4)
      local x = lutra.tensor({ 1, 3, 1, 4 }):randn(seed())
      local y = m:forward(x, { grad = false })
      E.expect_error(function() m:backward(y) end, "lutra_rope_backward", "grad = false")
    end)

    it("a module on a device this build or machine lacks is refused at construction", function()
      local ok, err = pcall(nn.RotaryEmbedding, 8, { device = "cuda" })
      if lutra.device_available("cuda") then -- made there instead
        assert.is_true(ok, tostring(err))
        assert.are.equal("cuda", err:settings().device)
        return
      end
      assert.is_false(ok)
      assert.matches("lutra_rope_new", tostring(err), 1, true)
    end)
  end)

  it("the CUDA kernel, emulated on the CPU, equals the CPU reference byte for byte", function()
    -- kernels/rope/rope.cu, a thread per CUDA thread (spec/native/sim_rope.cpp); the CUDA headers
    -- are needed, not a GPU
    local shell = require("spec.support.shell")
    if not shell.has_cuda_header("cuda_fp16.h") then
      pending("no CUDA headers: spec/native/sim_rope.cpp needs them")
      return
    end
    local ok, out = shell.build_and_run("build/sim_rope", "spec/native/sim_rope.cpp", nil, "CUDA=0")
    assert.is_true(ok, out)
    assert.is_truthy(out:find("all cases: the same bytes", 1, true), out)
    assert.is_nil(out:find("FAIL", 1, true), out)
  end)

  it("a forward/backward/apply_qkv loop compiles as a LuaJIT trace", function()
    require("spec.support.jit_trace").assert_compiles("spec/support/jit_rope_loop.lua")
  end)
end)

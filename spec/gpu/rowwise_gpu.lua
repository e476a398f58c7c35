-- Rowwise scaling on the device against the CPU backend (lutra/formats.h;
-- kernels/quantize/quantize_rowwise.cu against src/backend/cpu/rowwise_cpu.c): the codes of both
-- copies, their per-row scale inverses and the dequantized values bit for bit, for every role,
-- input dtype, power_2_scale on and off, one-sided quantizers, rows of zeros and special values;
-- the skip flag; the GEMM of rowwise operands and a Linear's training step under
-- lutra.recipe.rowwise, cuda against cpu.
--
-- The GEMM bounds. Hopper has no rowwise-scaled FP8 GEMM that lutra uses: the operands are
-- dequantized to BF16 in the workspace (code * scale_inv of its row) and multiplied by cuBLASLt
-- in BF16 with f32 accumulation; the CPU dequantizes the same codes to f32 and runs one f32
-- sgemm. With power-of-two scales (the recipe's default) a dequantized value is an FP8 code
-- (at most 4 significant bits) times a power of two, exact in BF16: both sides multiply the same
-- values exactly and differ only in the order of the f32 sums, a relative error near
-- sqrt(k) * 2^-24 (NMSE about 1e-13 for k = 128..256): bound 1e-9. Without power-of-two scales
-- the BF16 dequantization rounds each operand once (relative error up to 2^-9, mean square
-- about 1.3e-6 per operand, so about 2.6e-6 per product): bound 1e-4. A wrong scale on one row
-- of 64, or a transposed layout, gives NMSE above 1e-2. Within one Linear every GEMM reads
-- operands quantized from the same inputs (x, the weight, dy), so no difference is carried into
-- a later quantization and the step's bounds are the GEMM's.
local lutra = require("lutra")
local ffi = require("ffi")
local R = lutra.recipe
local nn = lutra.nn
local S = require("spec.gpu.support")
local DEV, REF, hold = S.DEV, S.REF, S.hold
local function test(name, fn) S.test(it, name, fn) end

-- everything one quantization shows, as byte strings
local outputs = S.outputs_of("rowwise", "scale_inv")

-- x [rows, cols] of dtype dt on both devices, rows and columns of different magnitudes (so that
-- every scale differs), with whole rows and columns of zeros when zeros is set
local function input_pair(rows, cols, dt, seed, zeros)
  local base = lutra.tensor({ rows, cols }, "f32"):randn(seed)
  local v = base:read()
  local buf = ffi.new("float[?]", rows * cols)
  for r = 0, rows - 1 do
    for c = 0, cols - 1 do
      local x = v[r * cols + c] * 2 ^ (r % 9 - 4) * 2 ^ (c % 5 - 2)
      if zeros and (r % 7 == 3 or c % 11 == 5) then x = 0 end
      buf[r * cols + c] = x
    end
  end
  return S.from_buf_pair(buf, { rows, cols }, dt)
end

local function compare(recipe, role, parts, xr, xd, what)
  local opts = { rowwise = parts[1], columnwise = parts[2] }
  opts.device = REF
  local qr = hold(lutra.quantizer(recipe, role, opts))
  opts = { rowwise = parts[1], columnwise = parts[2], device = DEV }
  local qd = hold(lutra.quantizer(recipe, role, opts))
  local want = outputs(qr:quantize(xr), parts[1], parts[2])
  local got = outputs(qd:quantize(xd), parts[1], parts[2])
  local n = 0
  for k, v in pairs(want) do
    S.assert_same_bytes(got[k], v, what .. ": " .. k)
    n = n + 1
  end
  assert.is_true(n >= 4, what .. ": nothing compared")
end

-- 64x64 columnwise tiles and 16-element rows: partial tiles, one tile, several row slices
local shapes = { { 48, 80 }, { 16, 16 }, { 144, 208 }, { 16, 1040 }, { 592, 32 } }

describe("rowwise scaling on " .. DEV, function()
  for _, role in ipairs { "input", "weight", "grad_output" } do
    for _, dt in ipairs { "f32", "bf16", "f16" } do
      for _, p2 in ipairs { true, false } do
        local what = string.format("%s, %s, power_2_scale %s", role, dt, tostring(p2))
        test(what .. ": both copies' codes, scale_inv and dequantized values as the CPU's", function()
          -- hybrid: grad_output in E5M2
          local recipe = R.rowwise { power_2_scale = p2, fp8_format = "hybrid" }
          for i, s in ipairs(shapes) do
            local xr, xd = input_pair(s[1], s[2], dt, 10 * i + #role, i % 2 == 0)
            compare(recipe, role, { true, true }, xr, xd,
                    string.format("%s %dx%d", what, s[1], s[2]))
          end
        end)
      end
    end
  end

  for _, parts in ipairs { { true, false }, { false, true } } do
    test(string.format("one copy (rowwise %s, columnwise %s) as the CPU's", tostring(parts[1]),
                       tostring(parts[2])), function()
      local xr, xd = input_pair(80, 48, "bf16", 3, true)
      compare(R.rowwise(), "input", parts, xr, xd, "one copy")
    end)
  end

  test("amax_epsilon, an all-zero tensor, special values", function()
    local xr, xd = S.special_values_pair { [900] = 3e38 }
    for _, p2 in ipairs { true, false } do
      compare(R.rowwise { power_2_scale = p2 }, "input", { true, true }, xr, xd,
              "special values, power_2_scale " .. tostring(p2))
      compare(R.rowwise { power_2_scale = p2, amax_epsilon = 1e-3 }, "weight", { true, true }, xr,
              xd, "special values, amax_epsilon 1e-3")
    end
    local zr = lutra.tensor({ 32, 48 }, "bf16", REF):fill(0)
    local zd = lutra.tensor({ 32, 48 }, "bf16", DEV):fill(0)
    compare(R.rowwise(), "input", { true, true }, zr, zd, "all zeros")
    compare(R.rowwise { amax_epsilon = 0.5 }, "input", { true, true }, zr, zd,
            "all zeros, amax_epsilon 0.5")
  end)

  test("a set skip flag leaves every output as it was; a clear one quantizes", function()
    local q = hold(lutra.quantizer(R.rowwise(), "grad_output", { device = DEV }))
    local _, x1 = S.randn_pair({ 48, 64 }, "bf16", 1)
    local _, x2 = S.randn_pair({ 48, 64 }, "bf16", 2, 5)
    local t = q:quantize(x1)
    local before = outputs(t, true, true)
    local t1 = q:quantize_skip(x2, lutra.from_table({ 1 }, { 1 }, "i32", DEV))
    -- the same buffers (the quantizer keeps one output per shape), so the check below can fail
    assert.is_true(t1.data == t.data and t1.col_scale_inv == t.col_scale_inv, "another output")
    local after = outputs(t, true, true)
    for k, b in pairs(before) do S.assert_same_bytes(after[k], b, "skipped: " .. k) end
    t = q:quantize_skip(x2, lutra.from_table({ 0 }, { 1 }, "i32", DEV))
    local ref = hold(lutra.quantizer(R.rowwise(), "grad_output", { device = REF }))
    local want = outputs(ref:quantize(lutra.tensor({ 48, 64 }, "bf16", REF):randn(2, 0, 5)), true,
                         true)
    local got = outputs(t, true, true)
    for k, b in pairs(want) do S.assert_same_bytes(got[k], b, "not skipped: " .. k) end
  end)

  for _, p2 in ipairs { true, false } do
    local bound = p2 and 1e-9 or 1e-4
    test(string.format("the GEMM of rowwise operands (power_2_scale %s): NMSE <= %g", tostring(p2),
                       bound), function()
      S.assert_quantized_gemm(function() return R.rowwise { power_2_scale = p2 } end, bound,
                              "rowwise gemm", 4)
    end)
  end

  -- a CUDA graph holds the rowwise kernels (their column amaxes included) and the dequantizing
  -- GEMMs: replays equal eager steps bit for bit (every kernel of the step is deterministic)
  if DEV == "cuda" then
    test("a training step under lutra.recipe.rowwise in a CUDA graph: N replays equal N eager "
         .. "steps, bit for bit", function()
      local function trainer()
        local t = {}
        t.net = hold(nn.Sequential(nn.Linear(64, 128, { seed = 1, device = DEV }), nn.GELU(),
                                   nn.Linear(128, 32, { seed = 2, device = DEV })))
        t.loss = hold(nn.MSELoss())
        t.opt = hold(lutra.optim.SGD(t.net, { lr = 1e-2, momentum = 0.9 }))
        t.scope = lutra.autocast { recipe = R.rowwise { fp8_format = "hybrid" } }
        t.x = lutra.tensor({ 64, 64 }, "f32", DEV)
        t.target = lutra.tensor({ 64, 32 }, "f32", DEV)
        t.step = S.training_step(t)
        return t
      end
      local N = 5
      local eager, graphed = trainer(), trainer()
      local feed = S.batch_feed(N, { 64, 64 }, { 64, 32 }, 700, 800)
      S.eager_steps(eager, N, feed)
      local g = S.replayed_steps(graphed, N, feed)
      S.assert_same_params(eager, graphed, "after the replays")
      assert.are.equal(eager.loss:value(), graphed.loss:value(), "last loss")
      g:destroy()
    end)
  end

  -- The norm modules run the norm, then the rowwise casts (no fused norm + rowwise kernel on
  -- either backend). Their bounds are spec/gpu/fused_norm_gpu.lua's for FP8 recipes: the norm's
  -- outputs match bit for bit (make sim-norm) but its dgamma sums and the GEMMs' f32 sums run
  -- in another order, and in the MLP the second layer's input is quantized from the first GEMM's
  -- output, where a sum a rounding apart can land on the other side of an FP8 rounding boundary.
  for _, md in ipairs {
    { name = "LayerNormLinear", in_ = 256, out = 128, bound = 1e-5,
      make = function(o) return nn.LayerNormLinear(256, 128, o) end },
    { name = "LayerNormMLP gelu", in_ = 128, out = 128, bound = 1e-4,
      make = function(o) o.activation = "gelu" return nn.LayerNormMLP(128, 256, o) end },
  } do
    test(string.format("nn.%s under lutra.recipe.rowwise, two steps, as on the CPU: NMSE <= %g",
                       md.name, md.bound), function()
      local seed = math.random(1, 2 ^ 30)
      local m, p = {}, {}
      for i, dev in ipairs { REF, DEV } do
        m[i] = hold(md.make { device = dev, seed = seed })
        p[i] = m[i]:parameters()
        for j = 1, #p[i] do p[i][j].value:randn(seed + j, 0, 0.5) end
      end
      local recipes = { R.rowwise { fp8_format = "hybrid" }, R.rowwise { fp8_format = "hybrid" } }
      for step = 1, 2 do
        local xa, xb = S.randn_pair({ 64, md.in_ }, "f32", seed + 10 * step)
        local ga, gb = S.randn_pair({ 64, md.out }, "f32", seed + 10 * step + 1)
        local res = {}
        for i = 1, 2 do
          local sc = lutra.autocast { recipe = recipes[i] }
          sc:enter()
          local y = m[i]:forward(i == 1 and xa or xb)
          local dx = m[i]:backward(i == 1 and ga or gb)
          sc:exit()
          res[i] = { y = S.keep(y), dx = S.keep(dx) }
        end
        local what = md.name .. " step " .. step
        S.assert_nmse(res[2].y, res[1].y, md.bound, what .. ": y")
        S.assert_nmse(res[2].dx, res[1].dx, md.bound, what .. ": dx")
        for j = 1, #p[1] do
          S.assert_nmse(p[2][j].grad, p[1][j].grad, md.bound, what .. ": grad " .. j)
        end
      end
    end)
  end

  for _, cfg in ipairs { { p2 = true, format = "e4m3", dtype = "f32" },
                         { p2 = true, format = "hybrid", dtype = "bf16" },
                         { p2 = false, format = "hybrid", dtype = "f32" } } do
    local bound = cfg.p2 and 1e-9 or 1e-4
    -- a bf16 module rounds y, dx and dw once more into bf16 (relative 2^-9 at most): a sum a
    -- rounding apart can land on the other side of a bf16 rounding boundary
    if cfg.dtype == "bf16" then bound = 1e-5 end
    test(string.format("a Linear's training step under lutra.recipe.rowwise (%s, power_2_scale %s, "
                       .. "%s) as on the CPU: NMSE <= %g", cfg.format, tostring(cfg.p2), cfg.dtype,
                       bound), function()
      local want, got = S.linear_step_pair(function()
        return R.rowwise { power_2_scale = cfg.p2, fp8_format = cfg.format }
      end, 96, cfg.dtype)
      for k in pairs(want) do
        S.assert_nmse(got[k], want[k], bound, k)
      end
      -- and it did quantize: the high-precision Linear's output is an FP8 rounding away
      local hp = hold(nn.Linear(128, 64, { seed = 7, device = REF, dtype = cfg.dtype }))
      local yh = hp:forward(lutra.tensor({ 96, 128 }, cfg.dtype, REF):randn(8))
      local e = S.nmse_buf(S.keep(yh):read(), want.y:read(), 96 * 64, "high precision")
      assert.is_true(e > 1e-7, "the rowwise Linear's output equals the high-precision one")
    end)
  end
end)

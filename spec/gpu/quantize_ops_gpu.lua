-- GPU quantizers against the CPU backend, as tables of cases over spec/support/op_harness.lua:
-- every recipe's codes (rowwise and columnwise), scales, raw scale arrays and dequantization,
-- bit-identical to the CPU, on random inputs, on the FP8 grid (RNE ties, saturation), on
-- special values (NaN, inf, subnormals, zero blocks) and one-sided quantizers; and the
-- delayed-scaling histories over quantize / record_amax / update rounds. See spec/gpu/ops_gpu.lua
-- for the reference and the device choice (LUTRA_TEST_DEVICE).
local math, string, ipairs, tostring = math, string, ipairs, tostring
local HUGE = math.huge
local lutra = require("lutra")
local ffi = require("ffi")
local C = lutra.C
local R = lutra.recipe

local S = require("spec.gpu.support")
local H = require("spec.support.op_harness")
local F = require("spec.support.fp8_bytes")
local DEV, poisoned, f32, hold = S.DEV, S.poisoned, S.f32, S.hold
local ENV = { it = it, pending = pending }
local E4M3, E5M2 = C.LUTRA_E4M3, C.LUTRA_E5M2
local FLT_MAX = 3.4028234663852886e38
local NZERO = -0.0

local function quantizer(r, role, opts, dev)
  opts.device = dev
  return hold(lutra.quantizer(r, role, opts))
end

-- Everything one FP8 output t of quantizer q shows, as outputs labelled prefix..": ..." (all
-- compared by bytes): dtype (which must be fmt), scaling, dims, the per-tensor scale (tensor),
-- and for each copy asked for its codes, raw scale array (block scaling's padding included) and
-- its dequantization into a poisoned f32 tensor.
local function fp8_outputs(out, prefix, dev, q, t, fmt, tensor, rowwise, columnwise)
  assert.are.equal(fmt, t:dtype_name(), prefix .. ": FP8 dtype")
  out[prefix .. ": dtype"], out[prefix .. ": scaling"] = t:dtype_name(), t:scaling_name()
  out[prefix .. ": dims"] = t:dims()
  if tensor then out[prefix .. ": scale, scale_inv"] = { q:scale() } end
  local dims = t:dims()
  for _, cw in ipairs { false, true } do
    if (cw and columnwise ~= false) or (not cw and rowwise ~= false) then
      local side = cw and "columnwise" or "rowwise"
      out[prefix .. ": " .. side .. " codes"] = t:bytes(cw)
      local sb, esize = F.scale_bytes(t, cw)
      out[prefix .. ": " .. side .. " scale array"] = H.blob(sb, esize == 1 and C.LUTRA_E8M0 or C.LUTRA_F32)
      local shape = cw and { dims[2], dims[1] } or { dims[1], dims[2] }
      out[prefix .. ": " .. side .. " dequantized (f32)"] = lutra.dequantize(t, poisoned(shape, "f32", dev), cw)
    end
  end
  return out
end

-- ---- every recipe on random inputs ----------------------------------------------------------

-- every quantizer kind and format: tensor = one scale (q:scale() is compared), mx = MXFP8 (dims
-- must be multiples of 32), delayed = scale from an update
-- a custom recipe cannot make input and grad_output both E5M2 (no GEMM takes E5M2 x E5M2), so the
-- E5M2 input quantizer and the E5M2 grad_output quantizer come from two recipes
local function custom_recipe()
  return R.custom { input = { kind = "current", format = "e5m2" },
                    weight = { kind = "block_2d", format = "e4m3" },
                    grad_output = { kind = "mxfp8", format = "e4m3" } }
end
local function custom_recipe_e5m2_grad()
  return R.custom { input = { kind = "current", format = "e4m3" },
                    weight = { kind = "block_2d", format = "e4m3" },
                    grad_output = { kind = "mxfp8", format = "e5m2" } }
end
local QCONFIGS = {
  { big = true, name = "delayed input (e4m3)", make = function() return R.delayed { amax_history_len = 4 } end,
    role = "input", fmt = "e4m3", tensor = true, delayed = true },
  { name = "delayed grad_output (e5m2)", make = function() return R.delayed { amax_history_len = 4 } end,
    role = "grad_output", fmt = "e5m2", tensor = true, delayed = true },
  { name = "current input (e4m3)", make = function() return R.current() end, role = "input",
    fmt = "e4m3", tensor = true },
  { big = true, name = "current grad_output (e5m2)", make = function() return R.current() end,
    role = "grad_output", fmt = "e5m2", tensor = true },
  { name = "current power_2_scale weight", make = function() return R.current { power_2_scale = true } end,
    role = "weight", fmt = "e4m3", tensor = true },
  { name = "current amax_epsilon=0.5 input", make = function() return R.current { amax_epsilon = 0.5 } end,
    role = "input", fmt = "e4m3", tensor = true },
  { big = true, name = "mxfp8 input (e4m3)", make = function() return R.mxfp8() end, role = "input",
    fmt = "e4m3", mx = true },
  { big = true, name = "mxfp8 hybrid grad_output (e5m2)", make = function() return R.mxfp8 { fp8_format = "hybrid" } end,
    role = "grad_output", fmt = "e5m2", mx = true },
  { big = true, name = "block input (1x128, power_2_scale)", make = function() return R.block() end,
    role = "input", fmt = "e4m3" },
  { big = true, name = "block weight (128x128, power_2_scale)", make = function() return R.block() end,
    role = "weight", fmt = "e4m3" },
  { name = "block hybrid grad_output (1x128, no power_2_scale)",
    make = function() return R.block { fp8_format = "hybrid", power_2_scale = false } end,
    role = "grad_output", fmt = "e5m2" },
  { name = "block weight (128x128, no power_2_scale)",
    make = function() return R.block { power_2_scale = false } end, role = "weight", fmt = "e4m3" },
  { name = "custom input (current, e5m2)", make = custom_recipe, role = "input", fmt = "e5m2",
    tensor = true },
  { name = "custom weight (block_2d, e4m3)", make = custom_recipe, role = "weight", fmt = "e4m3" },
  { name = "custom grad_output (mxfp8, e5m2)", make = custom_recipe_e5m2_grad, role = "grad_output",
    fmt = "e5m2", mx = true },
}

-- (1024x4096 only for the configs marked big = true: one per quantizer kind and format)
local QSIZES = {
  { 64, 96 }, { 256, 1024 }, { 1024, 4096 },
  { 48, 80, not_mx = true },   -- partial 128-blocks; not a multiple of 32
  { 144, 272, not_mx = true }, -- partial blocks and tiles in both dims
}

local Q = {}
local function add(list, case) list[#list + 1] = case end

for _, cfg in ipairs(QCONFIGS) do
  for _, size in ipairs(QSIZES) do
    if not (cfg.mx and size.not_mx) and (cfg.big or size[1] * size[2] < 1e6) then
      for _, dt in ipairs { "f32", "bf16" } do
        local rows, cols = size[1], size[2]
        local big = rows * cols > 1e6
        -- the largest size with one magnitude, to keep the suite fast
        local stds = big and { 1 } or { 1e-3, 1, 300 }
        add(Q, { name = cfg.name, params = { shape = { rows, cols }, input = dt },
          inputs = function(dev)
            local x = {}
            for si, std in ipairs(stds) do
              x[si] = lutra.tensor({ rows, cols }, dt, dev):randn(1000 * si + rows + cols, 0, std)
            end
            return x
          end,
          run = function(dev, x)
            -- one quantizer for all magnitudes: its output buffer is reused, so the previous
            -- call's codes are the "poison" the next call must overwrite
            local q, out = quantizer(cfg.make(), cfg.role, {}, dev), {}
            for si, std in ipairs(stds) do
              local what = "std " .. std
              local t = q:quantize(x[si])
              fp8_outputs(out, what, dev, q, t, cfg.fmt, cfg.tensor)
              if cfg.delayed then
                -- the cast recorded max|x| into history[0]; after an update, the new scale
                out[what .. ": history after the cast"] = q:history(4)
                q:update()
                out[what .. ": history after update"] = q:history(4)
                t = q:quantize(x[si])
                fp8_outputs(out, what .. " (after update)", dev, q, t, cfg.fmt, cfg.tensor)
              end
              if not big then -- dequantize into bf16 too
                out[what .. ": dequantized (bf16)"] = lutra.dequantize(t, poisoned({ rows, cols }, "bf16", dev), false)
              end
            end
            return out
          end })
      end
    end
  end
end

-- ---- the FP8 grid -------------------------------------------------------------------------------

-- Values on the FP8 grid and exactly between grid points (RNE ties), a hair off the ties,
-- subnormals and -0, with +-fp8_max on every 32nd diagonal so that every 1x32, 1x128 and
-- 128x128 block (rowwise and columnwise) has amax = fp8_max: then every recipe's scale is
-- exactly 1 (fp8_max / amax; E8M0 127; delayed starts at 1) and each code must equal
-- lutra_encode(x), the scalar reference, on both devices. Delayed scaling (scale 1 before
-- any update) also gets values above the max and +-inf, which must saturate.
local function grid_matrix(fmt, saturate)
  local code, maxcode = fmt == "e4m3" and E4M3 or E5M2, fmt == "e4m3" and 0x7E or 0x7B
  local fmax = C.lutra_dtype_max(code)
  local vals = {}
  for c = 0, maxcode - 1 do
    local lo, hi = C.lutra_decode(code, c), C.lutra_decode(code, c + 1)
    local mid = (lo + hi) / 2
    for _, v in ipairs { lo, mid, f32(mid * (1 + 2 ^ -20)), f32(mid * (1 - 2 ^ -20)) } do
      vals[#vals + 1] = v
      vals[#vals + 1] = -v
    end
  end
  vals[#vals + 1] = NZERO
  vals[#vals + 1] = 1e-40
  if saturate then
    for _, v in ipairs { fmax * 1.01, -fmax * 1.5, 1e6, -3e38, HUGE, -HUGE } do vals[#vals + 1] = v end
  end
  local rows, cols = 64, 96
  local b = ffi.new("float[?]", rows * cols)
  local k = 0
  for r = 0, rows - 1 do
    for c = 0, cols - 1 do
      if (r + c) % 32 == 0 then
        b[r * cols + c] = ((r + c) % 64 == 0) and fmax or -fmax
      else
        b[r * cols + c] = vals[k % #vals + 1]
        k = k + 1
      end
    end
  end
  return b, rows, cols, code
end

local GRID = {
  { name = "delayed input", make = function() return R.delayed() end, role = "input", fmt = "e4m3", sat = true, tensor = true },
  { name = "delayed grad_output", make = function() return R.delayed() end, role = "grad_output", fmt = "e5m2", sat = true, tensor = true },
  { name = "current input", make = function() return R.current() end, role = "input", fmt = "e4m3", tensor = true },
  { name = "current grad_output", make = function() return R.current() end, role = "grad_output", fmt = "e5m2", tensor = true },
  { name = "current power_2_scale", make = function() return R.current { power_2_scale = true } end, role = "input", fmt = "e4m3", tensor = true },
  { name = "mxfp8 input", make = function() return R.mxfp8() end, role = "input", fmt = "e4m3" },
  { name = "mxfp8 grad_output", make = function() return R.mxfp8 { fp8_format = "hybrid" } end, role = "grad_output", fmt = "e5m2" },
  { name = "block input", make = function() return R.block() end, role = "input", fmt = "e4m3" },
  { name = "block weight", make = function() return R.block() end, role = "weight", fmt = "e4m3" },
  { name = "block grad_output (no power_2_scale)", make = function() return R.block { fp8_format = "hybrid", power_2_scale = false } end, role = "grad_output", fmt = "e5m2" },
}
for _, g in ipairs(GRID) do
  for _, dt in ipairs { "f32", "bf16" } do
    add(Q, { name = g.name .. ": ties, off-ties, subnormals" .. (g.sat and ", saturation" or "")
                    .. " encode as lutra_encode", params = { input = dt },
      inputs = function(dev)
        local b, rows, cols = grid_matrix(g.fmt, g.sat)
        return { x = lutra.tensor({ rows, cols }, dt, dev):set(b) }
      end,
      run = function(dev, x)
        local q = quantizer(g.make(), g.role, {}, dev)
        return fp8_outputs({}, g.name, dev, q, q:quantize(x.x), g.fmt, g.tensor)
      end,
      -- the device's codes against the scalar reference of the stored (possibly bf16-rounded) inputs
      check = function(got, _, _, xref)
        local _, rows, cols, code = grid_matrix(g.fmt, g.sat)
        local xv = xref.x:read()
        local want_r, want_c = ffi.new("uint8_t[?]", rows * cols), ffi.new("uint8_t[?]", rows * cols)
        for i = 0, rows - 1 do
          for j = 0, cols - 1 do
            local e = C.lutra_encode(code, xv[i * cols + j])
            want_r[i * cols + j], want_c[j * rows + i] = e, e
          end
        end
        S.assert_same_bytes(got[g.name .. ": rowwise codes"], ffi.string(want_r, rows * cols), "rowwise codes vs lutra_encode")
        S.assert_same_bytes(got[g.name .. ": columnwise codes"], ffi.string(want_c, rows * cols), "columnwise codes vs lutra_encode")
      end })
  end
end

-- ---- zeros, a subnormal amax, one-sided quantizers --------------------------------------------

for _, cfg in ipairs(QCONFIGS) do
  add(Q, { name = cfg.name .. ": all-zero input",
    inputs = function(dev) return { x = lutra.tensor({ 32, 64 }, "f32", dev) } end,
    run = function(dev, x)
      local q = quantizer(cfg.make(), cfg.role, {}, dev)
      return fp8_outputs({}, "all zero", dev, q, q:quantize(x.x), cfg.fmt, cfg.tensor)
    end })
end
-- 448 / 1e-40 overflows f32: FLT_MAX (2^127 with power_2_scale). A device that flushes
-- subnormals to zero computes amax 0 instead and gets scale 1.
for _, p2 in ipairs { false, true } do
  add(Q, { name = "current: a lone f32 subnormal amax gives scale FLT_MAX (2^127 with power_2_scale)",
    params = { power_2_scale = p2 },
    inputs = function(dev)
      local vals = ffi.new("float[?]", 256)
      vals[5] = 1e-40
      return { x = lutra.tensor({ 16, 16 }, "f32", dev):set(vals) }
    end,
    run = function(dev, x)
      local q = quantizer(R.current { power_2_scale = p2 }, "input", {}, dev)
      return fp8_outputs({}, "subnormal amax", dev, q, q:quantize(x.x), "e4m3", true)
    end,
    check = function(got)
      assert.are.equal(p2 and 2 ^ 127 or FLT_MAX, got["subnormal amax: scale, scale_inv"][1])
    end })
end

for _, kind in ipairs { { "current", function() return R.current() end, true },
                        { "mxfp8", function() return R.mxfp8() end },
                        { "block", function() return R.block() end },
                        { "delayed", function() return R.delayed() end, true } } do
  add(Q, { name = kind[1] .. ": rowwise-only and columnwise-only quantizers",
    inputs = function(dev) return { x = lutra.tensor({ 64, 160 }, "f32", dev):randn(4242, 0, 2) } end,
    run = function(dev, x)
      local out, r = {}, kind[2]()
      local q = quantizer(r, "input", { columnwise = false }, dev)
      local t = q:quantize(x.x)
      assert.is_true(t.col_data == nil, "rowwise-only quantizer made a columnwise copy")
      fp8_outputs(out, "rowwise only", dev, q, t, "e4m3", kind[3], true, false)
      q = quantizer(r, "input", { rowwise = false }, dev)
      t = q:quantize(x.x)
      assert.is_true(t.data == nil, "columnwise-only quantizer made rowwise data")
      fp8_outputs(out, "columnwise only", dev, q, t, "e4m3", kind[3], false, true)
      -- get_f32 of a columnwise-only tensor dequantizes and transposes back
      out["columnwise-only read()"] = H.f32_blob(t:read(), 64 * 160)
      return out
    end })
end

-- ---- special values through the 16-bit kernels ----------------------------------------------

-- MXFP8 of 16-bit inputs has its own CUDA kernel (128x128 tiles held in registers, a fast path
-- for warps without NaN or infinity, scales stored 4 bytes at a time where aligned): blocks with
-- NaN of either sign, +-inf, subnormals, -0 and all-zero blocks, tiny blocks whose E8M0 scale is
-- 0 or 1 (bf16), partial tiles in both dims, one-sided outputs, scale rows whose 4-byte runs are
-- not aligned (cols / 32 = 3, 7, 129; rows / 32 = 5, 9, 65), and (2080x4128) more tiles than
-- fit on the GPU at once. The per-tensor cast + transpose of 16-bit inputs has its own kernel
-- too (the same tiles, the amax fused for delayed scaling): the same values, dims that are
-- multiples of 16 but not of 32 (48x80), and the amax history after the cast.
local special_cache = {} -- host buffers only: each device still gets fresh tensors
local function mx_special_matrix(rows, cols, dt)
  local key = rows .. "x" .. cols .. dt
  if special_cache[key] then return special_cache[key] end
  local b = ffi.new("float[?]", rows * cols)
  local tiny = dt == "bf16" and { 1e-40, 3e-39, -5.9e-39, 2.6e-36 } or { 6e-8, -3e-7, 1e-5, 6.1e-5 }
  for r = 0, rows - 1 do
    for c = 0, cols - 1 do
      local i = r * cols + c
      local blk = math.floor(r / 32) * 7 + math.floor(c / 32) * 3
      local ex
      if dt == "bf16" then
        ex = blk % 5 == 4 and -100 - blk % 40 or (r * 7 + c) % 40 - 20
      else
        ex = blk % 5 == 4 and -20 - blk % 5 or (r * 7 + c) % 24 - 16
      end
      local v = math.sin(i * 0.7311 + 0.3) * 2 ^ ex
      local u = (i * 2654435761) % 1000
      if blk % 5 == 2 then v = 0
      elseif u == 1 then v = 0 / 0
      elseif u == 2 then v = -(0 / 0)
      elseif u == 3 then v = HUGE
      elseif u == 4 then v = -HUGE
      elseif u < 15 then v = tiny[u % 4 + 1]
      elseif u < 20 then v = NZERO
      end
      b[i] = v
    end
  end
  special_cache[key] = b
  return b
end
local function special_inputs(rows, cols, dt)
  return function(dev)
    return { x = lutra.tensor({ rows, cols }, dt, dev):set(mx_special_matrix(rows, cols, dt)) }
  end
end

for _, dt in ipairs { "bf16", "f16" } do
  for _, size in ipairs { { 32, 32 }, { 160, 96 }, { 288, 224 }, { 2080, 4128 } } do
    local rows, cols = size[1], size[2]
    for _, f in ipairs { { "e4m3", "input", {} }, { "e5m2", "grad_output", { fp8_format = "hybrid" } } } do
      local sides = rows * cols > 1e6 and { { true, true } } or { { true, true }, { true, false }, { false, true } }
      for _, side in ipairs(sides) do
        add(Q, { name = "mxfp8 of NaN, inf, subnormals, zero and tiny blocks",
          params = { input = dt, shape = size, format = f[1], rowwise = side[1], columnwise = side[2] },
          inputs = special_inputs(rows, cols, dt), inputs_compare = "bits_nan",
          run = function(dev, x)
            local q = quantizer(R.mxfp8(f[3]), f[2], { rowwise = side[1], columnwise = side[2] }, dev)
            return fp8_outputs({}, "mxfp8", dev, q, q:quantize(x.x), f[1], false, side[1], side[2])
          end })
      end
    end
  end
  for _, size in ipairs { { 48, 80 }, { 160, 96 }, { 288, 224 }, { 2080, 4128 } } do
    local rows, cols = size[1], size[2]
    for _, cfg in ipairs { { "delayed input", "input", "e4m3", true },
                           { "delayed grad_output", "grad_output", "e5m2", true },
                           { "current input", "input", "e4m3", false } } do
      add(Q, { name = "per-tensor cast + transpose of NaN, inf, subnormals, zero blocks, amax",
        params = { recipe = cfg[1], input = dt, shape = size },
        inputs = special_inputs(rows, cols, dt), inputs_compare = "bits_nan",
        run = function(dev, x)
          local r = cfg[4] and R.delayed { amax_history_len = 2 } or R.current()
          local q = quantizer(r, cfg[2], {}, dev)
          local out = fp8_outputs({}, "cast", dev, q, q:quantize(x.x), cfg[3], true)
          if cfg[4] then
            out["amax history after the cast"] = q:history(2)
            q:update()
            fp8_outputs(out, "cast after update", dev, q, q:quantize(x.x), cfg[3], true)
          end
          return out
        end })
    end
  end
end

describe("quantizers on " .. DEV .. " (codes, scales and dequantization bit-identical to the CPU)", function()
  H.run(Q, ENV)
end)

-- ---- delayed scaling histories -------------------------------------------------------------

local D = {}
for _, cfg in ipairs { { L = 4, algo = "max", margin = 0, role = "input" },
                       { L = 3, algo = "most_recent", margin = 1, role = "grad_output" },
                       { L = 8, algo = "max", margin = 2, role = "weight" },
                       { L = 1, algo = "max", margin = 0, role = "grad_output" } } do
  local fmt = cfg.role == "grad_output" and "e5m2" or "e4m3"
  local function round_dt(round) return round % 2 == 0 and "bf16" or "f32" end
  local function round_std(round) return 10 ^ ((round % 4) - 2) end -- 0.01 .. 10
  add(D, { name = "quantize / record_amax / update rounds: identical histories, scales and codes",
    params = { L = cfg.L, algo = cfg.algo, margin = cfg.margin, role = cfg.role },
    inputs = function(dev)
      local x = {}
      for round = 1, 8 do
        if round ~= 5 and round ~= 6 then
          for k = 1, 2 do
            x[string.format("round %d cast %d", round, k)] = lutra.tensor({ 64, 96 }, round_dt(round), dev)
              :randn(9000 + 10 * round + k, 0, round_std(round) * k)
          end
        end
      end
      return x
    end,
    run = function(dev, x)
      local r = R.delayed { amax_history_len = cfg.L, amax_compute_algo = cfg.algo, margin = cfg.margin }
      local q, out = quantizer(r, cfg.role, {}, dev), {}
      local function state(what)
        out[what .. ": history"], out[what .. ": scale, scale_inv"] = q:history(cfg.L), { q:scale() }
      end
      for round = 1, 8 do
        local what = "round " .. round
        if round == 5 then
          -- a round with no cast: the amax comes from record_amax
          q:record_amax(f32(3.75 * round_std(round)))
        elseif round == 6 then
          -- an all-zero tensor: amax 0 (under "max" the history keeps the scale finite)
          local z = lutra.tensor({ 32, 64 }, round_dt(round), dev)
          fp8_outputs(out, what .. " zeros", dev, q, q:quantize(z), fmt, true)
        else
          -- two casts in one round: history[0] keeps the max of both
          for k = 1, 2 do
            local name = string.format("round %d cast %d", round, k)
            fp8_outputs(out, name, dev, q, q:quantize(x[name]), fmt, true)
          end
        end
        state(what .. " before update")
        q:update()
        state(what .. " after update")
      end
      return out
    end })
end

describe("delayed scaling on " .. DEV, function()
  H.run(D, ENV)
end)

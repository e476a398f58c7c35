-- lutra_quantize_dbias on the device against the CPU backend: the FP8 output must be
-- bit-identical to the CPU's, the bias gradient close (the fused CUDA kernel sums each 64-row
-- tile in f32 and the tiles in double; the CPU sums in double): NMSE <= 1e-10 for an f32
-- dbias, <= 1e-5 for bf16. Covers the fused path (a columnwise output: delayed, current and
-- MXFP8) and the fallback (rowwise only; 1x128 blocks), partial tiles, and accumulate.
local lutra = require("lutra")
local R = lutra.recipe
local S = require("spec.gpu.support")
local DEV, REF, hold = S.DEV, S.REF, S.hold
local function test(name, fn) S.test(it, name, fn) end

local CONFIGS = {
  { name = "delayed, row+col (fused)", make = function() return R.delayed { amax_history_len = 4 } end },
  { name = "current, row+col (fused)", make = function() return R.current {} end },
  { name = "mxfp8, row+col (fused)", make = function() return R.mxfp8 {} end },
  { name = "delayed, rowwise only (bias kernel)", rowwise_only = true,
    make = function() return R.delayed { amax_history_len = 4 } end },
  { name = "block 1x128 (bias kernel)", make = function() return R.block {} end },
}
local SIZES = { { 128, 256 }, { 96, 160 }, { 2048, 1024 } }

describe("quantize + bias gradient on " .. DEV, function()
  for _, cfg in ipairs(CONFIGS) do
    for _, size in ipairs(SIZES) do
      for _, dt in ipairs { "f32", "bf16" } do
        local rows, cols = size[1], size[2]
        test(string.format("%s, %dx%d %s", cfg.name, rows, cols, dt), function()
          local r = cfg.make()
          local opts = { columnwise = not cfg.rowwise_only }
          local qa = hold(lutra.quantizer(r, "grad_output", { device = REF, columnwise = opts.columnwise }))
          local qb = hold(lutra.quantizer(r, "grad_output", { device = DEV, columnwise = opts.columnwise }))
          local seed = math.random(1, 2 ^ 30)
          local xa = lutra.tensor({ rows, cols }, dt, REF):randn(seed, 0.25, 1)
          local xb = lutra.tensor({ rows, cols }, dt, DEV):randn(seed, 0.25, 1)
          for _, bdt in ipairs { "f32", "bf16" } do
            local bound = bdt == "f32" and 1e-10 or 1e-5
            local what = string.format("%s %dx%d %s -> dbias %s", cfg.name, rows, cols, dt, bdt)
            local da = lutra.tensor({ cols }, bdt, REF):fill(0 / 0)
            local db = lutra.tensor({ cols }, bdt, DEV):fill(0 / 0)
            local ta, tb = qa:quantize_dbias(xa, da), qb:quantize_dbias(xb, db)
            assert.are.equal(ta:bytes(), tb:bytes(), what .. ": rowwise codes")
            if opts.columnwise then
              assert.are.equal(ta:bytes(true), tb:bytes(true), what .. ": columnwise codes")
            end
            S.assert_nmse(db, da, bound, what)
            -- accumulate onto the same random values on both devices
            local ia = lutra.tensor({ cols }, bdt, REF):randn(seed + 1)
            local ib = lutra.tensor({ cols }, bdt, DEV):randn(seed + 1)
            qa:quantize_dbias(xa, ia, true)
            qb:quantize_dbias(xb, ib, true)
            S.assert_nmse(ib, ia, bound, what .. " (accumulate)")
          end
        end)
      end
    end
  end
end)

-- State that CUDA graph replays read on the device, checked on the CPU reference (where the flags
-- are host memory, read when the call runs):
--   - a quantization's skip flag (TransformerEngine's noop flag, lutra_quantize_skip): with the
--     flag set nothing is written (codes, scale arrays, amax, the quantizer's scale and amax
--     history, dbias), for every recipe's quantizer; with it clear the result is the plain
--     quantization's, bit for bit;
--   - Linear with is_first_microbatch "device": the weight is quantized unless the device's
--     skip-weight-update flag (lutra.set_skip_weight_update) is set, when the FP8 weight of the
--     last quantization is used (checked against modules that hold the old and the new weight).
-- Every input is a fresh random tensor, and each "nothing changed" check is paired with a check
-- that the skipped work would have changed what is compared (so the test can fail).
local lutra = require("lutra")
local ffi = require("ffi")
local C = lutra.C
local R = lutra.recipe
local nn = lutra.nn

local DEV = "cpu"

local function fail(fmt, ...) error(string.format(fmt, ...), 2) end

local F = require("spec.support.fp8_bytes")
local same_bytes, view_bytes, scale_bytes = F.same_bytes, F.view_bytes, F.scale_bytes
local snapshot, same_snapshot = F.snapshot, F.same_snapshot

-- The quantizers: rowwise and columnwise outputs. `changes`: what a quantization of a new
-- input (larger magnitude) must change, so that "unchanged" is a real check.
local CONFIGS = {
  { name = "delayed input (e4m3)", make = function() return R.delayed { amax_history_len = 4 } end,
    role = "input", tensor = true, delayed = true, changes = { "row", "col", "history" } },
  { name = "delayed grad_output (e5m2)", make = function() return R.delayed { amax_history_len = 4 } end,
    role = "grad_output", tensor = true, delayed = true, changes = { "row", "col", "history" } },
  { name = "current input (e4m3)", make = function() return R.current() end, role = "input",
    tensor = true, changes = { "row", "col", "row_scales", "col_scales", "amax", "scale" } },
  { name = "current power_2_scale weight", make = function() return R.current { power_2_scale = true } end,
    role = "weight", tensor = true, changes = { "row", "col", "row_scales", "amax", "scale" } },
  { name = "mxfp8 input (e4m3)", make = function() return R.mxfp8() end, role = "input",
    changes = { "row", "col", "row_scales", "col_scales" } },
  { name = "mxfp8 hybrid grad_output (e5m2)", make = function() return R.mxfp8 { fp8_format = "hybrid" } end,
    role = "grad_output", changes = { "row", "col", "row_scales", "col_scales" } },
  { name = "block input (1x128)", make = function() return R.block { power_2_scale = false } end,
    role = "input", changes = { "row", "col", "row_scales", "col_scales" } },
  { name = "block weight (128x128)", make = function() return R.block { power_2_scale = false } end,
    role = "weight", changes = { "row", "col", "row_scales", "col_scales" } },
}

-- partial 128-blocks in both dims; multiples of 32 for MXFP8
local ROWS, COLS = 96, 160

describe("quantization skip flag (cpu)", function()
  for ci, cfg in ipairs(CONFIGS) do
    it(cfg.name .. ": a set flag writes nothing, a clear one quantizes", function()
      local r = cfg.make()
      local q = lutra.quantizer(r, cfg.role, { device = DEV })
      local ref = lutra.quantizer(r, cfg.role, { device = DEV })
      local skip = lutra.tensor({ 1 }, "i32", DEV):set({ 0 })
      local x1 = lutra.tensor({ ROWS, COLS }, "f32", DEV):randn(9100 + ci, 0, 1)
      local x2 = lutra.tensor({ ROWS, COLS }, "bf16", DEV):randn(9200 + ci, 0.5, 6)

      -- clear flag: the plain quantization
      local t = q:quantize_skip(x1, skip)
      same_snapshot(snapshot(q, t, cfg), snapshot(ref, ref:quantize(x1), cfg), "flag 0")
      local before = snapshot(q, t, cfg)

      -- set flag (any nonzero value): nothing written
      skip:set({ 7 })
      local t2 = q:quantize_skip(x2, skip)
      assert.is_true(t2 == t, "the output tensor was replaced")
      same_snapshot(snapshot(q, t2, cfg), before, "flag 7")
      -- what the skipped quantization would have written differs from what was kept
      local probe = lutra.quantizer(r, cfg.role, { device = DEV })
      local would = snapshot(probe, probe:quantize(x2), cfg) -- (history: [amax(x2), 0, 0, 0])
      for _, k in ipairs(cfg.changes) do
        assert.are_not.equal(would[k], before[k], cfg.name .. ": x2 would not change " .. k)
      end

      -- clear again: x2 quantized as the reference quantizes it after x1
      skip:set({ 0 })
      t = q:quantize_skip(x2, skip)
      same_snapshot(snapshot(q, t, cfg), snapshot(ref, ref:quantize(x2), cfg), "flag 0 again")

      -- no flag (nil) is the plain quantization too
      t = q:quantize_skip(x1, nil)
      same_snapshot(snapshot(q, t, cfg), snapshot(ref, ref:quantize(x1), cfg), "no flag")
    end)
  end

  it("with dbias: a set flag leaves dbias (and the output) untouched", function()
    for _, cfg in ipairs { CONFIGS[2], CONFIGS[4], CONFIGS[6], CONFIGS[7] } do
      for _, columnwise in ipairs { true, false } do
        local what = cfg.name .. (columnwise and "" or " rowwise only")
        local r = cfg.make()
        local opts = { device = DEV, columnwise = columnwise }
        local q, ref = lutra.quantizer(r, "grad_output", opts), lutra.quantizer(r, "grad_output", opts)
        local skip = lutra.tensor({ 1 }, "i32", DEV):set({ 0 })
        local x1 = lutra.tensor({ ROWS, COLS }, "f32", DEV):randn(9301, 0.25, 1)
        local x2 = lutra.tensor({ ROWS, COLS }, "f32", DEV):randn(9302, -0.5, 3)
        local db = lutra.tensor({ COLS }, "f32", DEV):fill(0 / 0)
        local dbr = lutra.tensor({ COLS }, "f32", DEV):fill(0 / 0)
        local t = q:quantize_skip(x1, skip, db, false)
        local tr = ref:quantize_dbias(x1, dbr, false)
        same_bytes(db:bytes(), dbr:bytes(), what .. ": dbias with flag 0")
        same_bytes(t:bytes(false), tr:bytes(false), what .. ": codes with flag 0")
        local kept_db, kept_codes = db:bytes(), t:bytes(false)
        skip:set({ 1 })
        q:quantize_skip(x2, skip, db, true)
        same_bytes(db:bytes(), kept_db, what .. ": dbias with flag 1 (accumulate)")
        q:quantize_skip(x2, skip, db, false)
        same_bytes(db:bytes(), kept_db, what .. ": dbias with flag 1")
        same_bytes(t:bytes(false), kept_codes, what .. ": codes with flag 1")
        skip:set({ 0 })
        q:quantize_skip(x2, skip, db, true)
        ref:quantize_dbias(x2, dbr, true)
        same_bytes(db:bytes(), dbr:bytes(), what .. ": dbias with flag 0 again (accumulate)")
        assert.are_not.equal(kept_db, db:bytes(), what .. ": dbias did not change")
      end
    end
  end)

  it("refuses a skip flag that is not one i32 on the quantizer's device", function()
    local q = lutra.quantizer(R.current(), "input", { device = DEV })
    local x = lutra.tensor({ 32, 32 }, "f32", DEV):randn(1)
    for _, bad in ipairs { lutra.tensor({ 1 }, "f32", DEV), lutra.tensor({ 2 }, "i32", DEV) } do
      local ok, err = pcall(q.quantize_skip, q, x, bad)
      assert.is_false(ok)
      assert.matches("lutra_quantize_skip: skip must be an i32 tensor of one element", err, 1, true)
    end
  end)
end)

-- ---- Linear: is_first_microbatch "device" --------------------------------------------------

local RECIPES = {
  { name = "delayed", make = function() return R.delayed { amax_history_len = 4 } end },
  { name = "current", make = function() return R.current() end },
  { name = "mxfp8", make = function() return R.mxfp8() end },
  { name = "block", make = function() return R.block() end },
}

local SW = require("spec.support.skip_weight")
local keep = SW.keep

describe("Linear with is_first_microbatch \"device\" (cpu)", function()
  local N, IN, OUT = 64, 96, 160

  after_each(function() lutra.set_skip_weight_update(DEV, false) end)

  -- y of a fresh Linear holding weight w (bias from the same seed), in a fresh scope
  local function reference(rc, w, x)
    local m = nn.Linear(IN, OUT, { seed = 31, device = DEV })
    m:parameters()[1].value:set(w)
    local s = lutra.autocast { recipe = rc.make() }
    return s:run(function() return keep(m:forward(x)) end)
  end

  for ri, rc in ipairs(RECIPES) do
    it(rc.name .. ": the flag set keeps the old FP8 weight, clear requantizes", function()
      local m = nn.Linear(IN, OUT, { seed = 31, device = DEV })
      local W = m:parameters()[1].value
      local w_old = W:to_table()
      local w_new = lutra.tensor({ OUT, IN }, "f32", DEV):uniform(9400 + ri, -0.3, 0.3):to_table()
      local w_newer = lutra.tensor({ OUT, IN }, "f32", DEV):uniform(9500 + ri, -0.2, 0.2):to_table()
      local x = lutra.tensor({ N, IN }, "f32", DEV):randn(9600 + ri, 0, 1)
      -- one scope for all forwards: delayed scaling's scales do not move between them
      local s = lutra.autocast { recipe = rc.make() }
      local y = s:run(function()
        local y = SW.forwards(m, x, DEV, w_new, w_newer)
        y.reuse = keep(m:forward(x, false)) -- the cache is the device-mode quantization
        return y
      end)
      local y_old, y_new = reference(rc, w_old, x), reference(rc, w_new, x)
      assert.are_not.equal(y_old:bytes(), y_new:bytes(), rc.name .. ": the weights give the same y")
      same_bytes(y.first:bytes(), y_old:bytes(), rc.name .. ": flag 0, first forward")
      same_bytes(y.skipped:bytes(), y_old:bytes(), rc.name .. ": flag 1 after the weight changed")
      same_bytes(y.updated:bytes(), y_new:bytes(), rc.name .. ": flag 0 after the weight changed")
      same_bytes(y.skipped2:bytes(), y_new:bytes(), rc.name .. ": flag 1 after a second change")
      same_bytes(y.reuse:bytes(), y_new:bytes(), rc.name .. ": false after device-mode forwards")
    end)
  end

  it("a Sequential passes \"device\" to its Linears", function()
    local function build()
      return nn.Sequential(nn.Linear(IN, OUT, { seed = 41, device = DEV }), nn.GELU(),
                           nn.Linear(OUT, IN, { seed = 42, device = DEV }))
    end
    local net = build()
    local x = lutra.tensor({ N, IN }, "f32", DEV):randn(9700, 0, 1)
    local s = lutra.autocast { recipe = R.current() }
    local y0, y1 = s:run(function()
      local a = keep(net:forward(x, "device"))
      for _, p in ipairs(net:parameters()) do p.value:uniform(9701, -0.2, 0.2) end
      lutra.set_skip_weight_update(DEV, true)
      local b = keep(net:forward(x, "device"))
      return a, b
    end)
    -- the biases changed too (they are not quantized), so compare against a twin that has the
    -- old weights and the new biases
    local twin = build()
    local pt, pn = twin:parameters(), net:parameters()
    for i = 2, #pt, 2 do pt[i].value:copy(pn[i].value) end
    local y_ref = s:run(function() return keep(twin:forward(x)) end)
    same_bytes(y1:bytes(), y_ref:bytes(), "Sequential with flag 1: old weights, new biases")
    assert.are_not.equal(y0:bytes(), y1:bytes(), "the biases did not change y")
  end)

  it("refuses the set flag before the weight was ever quantized, and after a recipe change", function()
    local m = nn.Linear(IN, OUT, { seed = 31, device = DEV })
    local x = lutra.tensor({ N, IN }, "f32", DEV):randn(9800, 0, 1)
    local s = lutra.autocast { recipe = R.current() }
    lutra.set_skip_weight_update(DEV, true)
    local ok, err = pcall(function() return s:run(function() return m:forward(x, "device") end) end)
    assert.is_false(ok)
    assert.matches("the skip-weight-update flag is set but this Linear has no quantized weight yet",
                   err, 1, true)
    lutra.set_skip_weight_update(DEV, false)
    s:run(function() return m:forward(x, "device") end)
    lutra.set_skip_weight_update(DEV, true)
    s:run(function() return m:forward(x, "device") end) -- cached now
    local s2 = lutra.autocast { recipe = R.mxfp8() }
    ok, err = pcall(function() return s2:run(function() return m:forward(x, "device") end) end)
    assert.is_false(ok)
    assert.matches("no quantized weight yet", err, 1, true)
  end)

  it("outside an FP8 scope \"device\" is a plain forward", function()
    local m = nn.Linear(IN, OUT, { seed = 31, device = DEV })
    local x = lutra.tensor({ N, IN }, "f32", DEV):randn(9900, 0, 1)
    lutra.set_skip_weight_update(DEV, true)
    local a = keep(m:forward(x, "device"))
    m:parameters()[1].value:uniform(9901, -0.1, 0.1)
    local b = keep(m:forward(x, "device"))
    same_bytes(b:bytes(), m:forward(x):bytes(), "device = nil outside a scope")
    assert.are_not.equal(a:bytes(), b:bytes(), "the weight change did not reach y")
  end)

  it("rejects bad arguments", function()
    local ok, err = pcall(lutra.set_skip_weight_update, DEV, 1)
    assert.is_false(ok)
    assert.matches("skip must be a boolean", err, 1, true)
    local m = nn.Linear(IN, OUT, { device = DEV })
    local x = lutra.tensor({ N, IN }, "f32", DEV)
    ok, err = pcall(m.forward, m, x, "dev")
    assert.is_false(ok)
    assert.matches("is_first_microbatch must be nil, true, false or \"device\"", err, 1, true)
    assert.are.equal(C.LUTRA_EINVAL, C.lutra_module_forward(m, x, 3, ffi.new("lutra_tensor*[1]")))
    assert.matches("is_first_microbatch must be", ffi.string(C.lutra_last_error()), 1, true)
    assert.are_not.equal(C.LUTRA_OK, C.lutra_set_skip_weight_update(7, 1))
    assert.matches("lutra_set_skip_weight_update: unknown device 7", ffi.string(C.lutra_last_error()),
                   1, true)
  end)
end)

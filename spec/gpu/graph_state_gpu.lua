-- State that CUDA graph replays read on the device, on the device against the CPU backend:
--   - quantization skip flags (lutra_quantize_skip, TransformerEngine's noop flag) on every
--     recipe's quantizer: the same sequence of set / clear flags on both devices must give
--     bit-identical codes, scale arrays, amaxes, scales and histories at every step, and with the
--     flag set the device's output must stay exactly what it was (current scaling's amax+scale
--     launch keeps two work words zero between calls: consecutive calls check that too, on a
--     tensor large enough for many blocks); dbias is left untouched by a skipped quantization
--     (fused and fallback bias-gradient paths);
--   - Linear with is_first_microbatch "device" and lutra.set_skip_weight_update;
--   - AdamW with the step counter on the device: five steps equal the CPU's within the
--     optimizer tolerance of module_steps_gpu.lua (f32 NMSE <= 1e-10, bf16 <= 1e-5), also with more
--     tensors than one launch takes (the counter advances once per step, on the last launch).
-- On cuda only (pending in the LUTRA_TEST_DEVICE=cpu smoke test, which cannot capture): the same
-- forward and AdamW step captured in a CUDA graph (lutra.graph) and replayed, against eager
-- runs, and lutra_set_skip_weight_update refused inside a capture.
local math, string, table, ipairs, pairs, pcall, error = math, string, table, ipairs, pairs, pcall,
                                                          error
local unpack = table.unpack or unpack
local lutra = require("lutra")
local ffi = require("ffi")
local C = lutra.C
local R = lutra.recipe
local nn = lutra.nn

local S = require("spec.gpu.support")
local DEV, REF, hold, fail, note = S.DEV, S.REF, S.hold, S.fail, S.note
local function test(name, fn) S.test(it, name, fn) end

local F = require("spec.support.fp8_bytes")
local same_bytes, view_bytes, scale_bytes = F.same_bytes, F.view_bytes, F.scale_bytes
local snapshot, same_snapshot = F.snapshot, F.same_snapshot

local CONFIGS = {
  { name = "delayed input (e4m3)", make = function() return R.delayed { amax_history_len = 4 } end,
    role = "input", tensor = true, delayed = true },
  { name = "delayed grad_output (e5m2)", make = function() return R.delayed { amax_history_len = 4 } end,
    role = "grad_output", tensor = true, delayed = true },
  { name = "current input (e4m3)", make = function() return R.current() end, role = "input",
    tensor = true },
  { name = "current power_2_scale weight", make = function() return R.current { power_2_scale = true } end,
    role = "weight", tensor = true },
  { name = "mxfp8 input (e4m3)", make = function() return R.mxfp8() end, role = "input" },
  { name = "mxfp8 hybrid grad_output (e5m2)", make = function() return R.mxfp8 { fp8_format = "hybrid" } end,
    role = "grad_output" },
  { name = "block input (1x128)", make = function() return R.block() end, role = "input" },
  { name = "block weight (128x128)", make = function() return R.block { power_2_scale = false } end,
    role = "weight" },
}
local SIZES = { { 96, 160 }, { 1024, 2048 } }

describe("quantization skip flags on " .. DEV .. " (bit-identical to the CPU)", function()
  for ci, cfg in ipairs(CONFIGS) do
    for _, size in ipairs(SIZES) do
      local rows, cols = size[1], size[2]
      test(string.format("%s, %dx%d", cfg.name, rows, cols), function()
        local r = cfg.make()
        local qa = hold(lutra.quantizer(r, cfg.role, { device = REF }))
        local qb = hold(lutra.quantizer(r, cfg.role, { device = DEV }))
        local ka = lutra.tensor({ 1 }, "i32", REF)
        local kb = lutra.tensor({ 1 }, "i32", DEV)
        local seed = math.random(1, 2 ^ 30)
        -- x2 is larger than x1, x3 smaller than x2: an amax kept from a skipped or earlier call
        -- would show
        local inputs = { { "f32", 0, 1 }, { "bf16", 0.5, 6 }, { "f32", -0.1, 0.01 } }
        local x = {}
        for i, spec in ipairs(inputs) do
          x[i] = { lutra.tensor({ rows, cols }, spec[1], REF):randn(seed + i, spec[2], spec[3]),
                   lutra.tensor({ rows, cols }, spec[1], DEV):randn(seed + i, spec[2], spec[3]) }
        end
        local kept
        -- { input, flag }: the sequence run on both devices
        for step, run in ipairs { { 1, 0 }, { 2, 1 }, { 2, 0 }, { 3, 0 }, { 1, 5 }, { 1, 0 } } do
          local what = string.format("%s %dx%d step %d (x%d, flag %d)", cfg.name, rows, cols, step,
                                     run[1], run[2])
          ka:set({ run[2] })
          kb:set({ run[2] })
          local ta = qa:quantize_skip(x[run[1]][1], ka)
          local tb = qb:quantize_skip(x[run[1]][2], kb)
          local sb = snapshot(qb, tb, cfg)
          same_snapshot(sb, snapshot(qa, ta, cfg), what)
          if run[2] ~= 0 then same_snapshot(sb, kept, what .. ", against the previous output") end
          kept = sb
        end
      end)
    end
  end

  -- dbias under the flag: the fused paths (columnwise output: delayed, current, MXFP8) and the
  -- bias-gradient kernel (rowwise only; block scaling), 256 rows: its two-launch form
  for _, cfg in ipairs { CONFIGS[2], CONFIGS[6], CONFIGS[4], CONFIGS[7] } do
    for _, columnwise in ipairs { true, false } do
      test(string.format("%s%s: a set flag leaves dbias untouched", cfg.name,
                         columnwise and "" or ", rowwise only"), function()
        local rows, cols = 256, 160
        local r = cfg.make()
        local opts = function(d) return { device = d, columnwise = columnwise } end
        local qa = hold(lutra.quantizer(r, "grad_output", opts(REF)))
        local qb = hold(lutra.quantizer(r, "grad_output", opts(DEV)))
        local ka = lutra.tensor({ 1 }, "i32", REF):set({ 0 })
        local kb = lutra.tensor({ 1 }, "i32", DEV):set({ 0 })
        local seed = math.random(1, 2 ^ 30)
        local xa1 = lutra.tensor({ rows, cols }, "f32", REF):randn(seed, 0.25, 1)
        local xb1 = lutra.tensor({ rows, cols }, "f32", DEV):randn(seed, 0.25, 1)
        local xa2 = lutra.tensor({ rows, cols }, "f32", REF):randn(seed + 1, -0.5, 3)
        local xb2 = lutra.tensor({ rows, cols }, "f32", DEV):randn(seed + 1, -0.5, 3)
        local da = lutra.tensor({ cols }, "f32", REF):fill(0 / 0)
        local db = lutra.tensor({ cols }, "f32", DEV):fill(0 / 0)
        qa:quantize_skip(xa1, ka, da, false)
        local tb = qb:quantize_skip(xb1, kb, db, false)
        S.assert_nmse(db, da, 1e-10, cfg.name .. ": dbias, flag 0")
        local kept_db, kept_codes = db:bytes(), tb:bytes(false)
        ka:set({ 1 })
        kb:set({ 1 })
        for _, acc in ipairs { true, false } do
          qa:quantize_skip(xa2, ka, da, acc)
          qb:quantize_skip(xb2, kb, db, acc)
          same_bytes(db:bytes(), kept_db, cfg.name .. ": dbias with flag 1")
          same_bytes(tb:bytes(false), kept_codes, cfg.name .. ": codes with flag 1")
        end
        ka:set({ 0 })
        kb:set({ 0 })
        qa:quantize_skip(xa2, ka, da, true)
        qb:quantize_skip(xb2, kb, db, true)
        S.assert_nmse(db, da, 1e-10, cfg.name .. ": dbias, flag 0 again (accumulate)")
        assert.are_not.equal(kept_db, db:bytes(), cfg.name .. ": dbias did not change")
      end)
    end
  end
end)

-- ---- Linear: is_first_microbatch "device" --------------------------------------------------

local SW = require("spec.support.skip_weight")
local keep = SW.keep

local LRECIPES = {
  { name = "delayed", make = function() return R.delayed { amax_history_len = 4 } end },
  { name = "current", make = function() return R.current() end },
  { name = "mxfp8", make = function() return R.mxfp8() end },
  { name = "block", make = function() return R.block() end },
}

describe("Linear with is_first_microbatch \"device\" on " .. DEV, function()
  local N, IN, OUT = 64, 128, 96
  -- the sequence of spec/graph_state_spec.lua on one device; returns the outputs
  local function run(rc, device, w_new, w_newer, x)
    local m = hold(nn.Linear(IN, OUT, { seed = 51, device = device }))
    local s = lutra.autocast { recipe = rc.make() }
    local ok, res = pcall(s.run, s, function()
      return SW.forwards(m, x, device, w_new, w_newer)
    end)
    lutra.set_skip_weight_update(device, false)
    if not ok then error(res, 0) end
    return res
  end

  for ri, rc in ipairs(LRECIPES) do
    test(rc.name .. ": the flag set keeps the old FP8 weight on the device, as on the CPU", function()
      local w_new = lutra.tensor({ OUT, IN }, "f32", REF):uniform(9400 + ri, -0.3, 0.3):read()
      local w_newer = lutra.tensor({ OUT, IN }, "f32", REF):uniform(9500 + ri, -0.2, 0.2):read()
      local xa = lutra.tensor({ N, IN }, "f32", REF):randn(9600 + ri, 0, 1)
      local xb = lutra.tensor({ N, IN }, "f32", DEV):randn(9600 + ri, 0, 1)
      local ya, yb = run(rc, REF, w_new, w_newer, xa), run(rc, DEV, w_new, w_newer, xb)
      -- on the device: the same GEMM on the same operands repeats bit for bit
      same_bytes(yb.skipped:bytes(), yb.first:bytes(), rc.name .. " on " .. DEV .. ": flag 1")
      same_bytes(yb.skipped2:bytes(), yb.updated:bytes(), rc.name .. " on " .. DEV .. ": flag 1 again")
      assert.are_not.equal(yb.updated:bytes(), yb.first:bytes(), rc.name .. ": flag 0 did not requantize")
      for _, k in ipairs { "first", "skipped", "updated", "skipped2" } do
        S.assert_nmse(yb[k], ya[k], 1e-6, rc.name .. " " .. k)
      end
    end)
  end
end)

-- ---- AdamW with the device step counter ----------------------------------------------------

describe("AdamW step counter on " .. DEV, function()
  local function hp_bound(dt) return dt == "bf16" and 1e-5 or 1e-10 end

  -- parameters and gradients set to the same values on both devices
  local function build(device, mods, dt)
    local list = {}
    for i, sz in ipairs(mods) do
      list[i] = nn.Linear(sz[1], sz[2], { seed = 60 + i, dtype = dt, device = device })
    end
    return hold(#list == 1 and list[1] or nn.Sequential(unpack(list)))
  end
  local function set_grads(m, seed)
    for i, p in ipairs(m:parameters()) do
      p.grad:set(lutra.tensor(p.value:dims(), "f32", REF):randn(seed + i, 0, 1):read())
    end
  end
  local function compare(ma, mb, dt, what)
    local pa, pb = ma:parameters(), mb:parameters()
    local exact = true
    for i = 1, #pa do
      S.assert_nmse(pb[i].value, pa[i].value, hp_bound(dt), what .. " param " .. i)
      exact = exact and pb[i].value:bytes() == pa[i].value:bytes()
    end
    note("%s: %s", what, exact and "bit-identical" or "within tolerance, not bit-identical")
  end
  -- n AdamW steps on both devices from the same fresh gradients, compared after each
  local function steps(ma, mb, opts, n, dt, what)
    local oa, ob = lutra.optim.AdamW(ma, opts), lutra.optim.AdamW(mb, opts)
    for step = 1, n do
      local seed = math.random(1, 2 ^ 30)
      set_grads(ma, seed)
      set_grads(mb, seed)
      oa:step()
      ob:step()
      compare(ma, mb, dt, what .. " step " .. step)
    end
  end

  for _, dt in ipairs { "f32", "bf16" } do
    -- betas far from the defaults, so that wrong bias corrections show at once: step t's bc1
    -- is 1 - 0.8^t (0.2, 0.36, 0.49, ...)
    test("five steps equal the CPU's (" .. dt .. " params)", function()
      local opts = { lr = 0.01, weight_decay = 0.1, beta1 = 0.8, beta2 = 0.95, eps = 1e-3 }
      local ma, mb = build(REF, { { 48, 32 } }, dt), build(DEV, { { 48, 32 } }, dt)
      steps(ma, mb, opts, 5, dt, "AdamW")
    end)
  end

  test("more tensors than one launch takes (140): the counter advances once per step", function()
    local mods = {}
    for i = 1, 70 do mods[i] = { 16, 16 } end
    local ma, mb = build(REF, mods, "f32"), build(DEV, mods, "f32")
    assert.are.equal(140, #mb:parameters())
    local opts = { lr = 0.01, beta1 = 0.8, beta2 = 0.9 }
    steps(ma, mb, opts, 3, "f32", "AdamW (140 tensors)")
  end)
end)

-- ---- CUDA graphs (cuda only) ---------------------------------------------------------------

if DEV ~= "cpu" then
  describe("CUDA graph replays on " .. DEV, function()
    test("a captured forward with \"device\" follows lutra.set_skip_weight_update at each replay", function()
      local N, IN, OUT = 64, 128, 96
      for ri, rc in ipairs { LRECIPES[2], LRECIPES[3] } do
        local m = hold(nn.Linear(IN, OUT, { seed = 71, device = DEV }))
        local W = m:parameters()[1].value
        local x = lutra.tensor({ N, IN }, "f32", DEV):randn(9700 + ri, 0, 1)
        local s = lutra.autocast { recipe = rc.make() }
        -- y of a twin holding weight w, eagerly
        local function eager(w)
          local t = hold(nn.Linear(IN, OUT, { seed = 71, device = DEV }))
          t:parameters()[1].value:copy(w)
          return s:run(function() return keep(t:forward(x)) end)
        end
        local w1 = keep(W)
        local w2 = lutra.tensor({ OUT, IN }, "f32", DEV):uniform(9710 + ri, -0.3, 0.3)
        local w3 = lutra.tensor({ OUT, IN }, "f32", DEV):uniform(9720 + ri, -0.2, 0.2)
        local y1, y2, y3 = eager(w1), eager(w2), eager(w3)
        lutra.set_skip_weight_update(DEV, false)
        local y
        local g = lutra.graph.capture(function()
          y = s:run(function() return m:forward(x, "device") end)
        end)
        local ok, err = pcall(function()
          same_bytes(y:bytes(), y1:bytes(), rc.name .. ": the warm-up forward")
          W:copy(w2)
          g:replay()
          same_bytes(y:bytes(), y2:bytes(), rc.name .. ": replay with flag 0 after a weight change")
          W:copy(w3)
          lutra.set_skip_weight_update(DEV, true)
          g:replay()
          same_bytes(y:bytes(), y2:bytes(), rc.name .. ": replay with flag 1 keeps the FP8 weight")
          lutra.set_skip_weight_update(DEV, false)
          g:replay()
          same_bytes(y:bytes(), y3:bytes(), rc.name .. ": replay with flag 0 again")
        end)
        lutra.set_skip_weight_update(DEV, false)
        if not ok then error(err, 0) end
      end
    end)

    test("a captured AdamW step takes the next step at each replay", function()
      local opts = { lr = 0.01, weight_decay = 0.1, beta1 = 0.8, beta2 = 0.95, eps = 1e-3 }
      local function model(device) return hold(nn.Linear(48, 32, { seed = 81, device = device })) end
      local ma, mb, mc = model(REF), model(DEV), model(DEV)
      local seed = math.random(1, 2 ^ 30)
      for _, m in ipairs { ma, mb, mc } do
        for i, p in ipairs(m:parameters()) do
          p.grad:set(lutra.tensor(p.value:dims(), "f32", REF):randn(seed + i, 0, 1):read())
        end
      end
      local oa, ob, oc = lutra.optim.AdamW(ma, opts), lutra.optim.AdamW(mb, opts),
                         lutra.optim.AdamW(mc, opts)
      -- graph: one eager warm-up step, then five replays = six steps
      local g = lutra.graph.capture(function() oc:step() end)
      for _ = 1, 5 do g:replay() end
      for _ = 1, 6 do
        oa:step()
        ob:step()
      end
      local pa, pb, pc = ma:parameters(), mb:parameters(), mc:parameters()
      for i = 1, #pa do
        same_bytes(pc[i].value:bytes(), pb[i].value:bytes(), "graph vs eager on " .. DEV .. ", param " .. i)
        S.assert_nmse(pc[i].value, pa[i].value, 1e-10, "graph vs CPU, param " .. i)
      end
      -- seven steps on the CPU would differ: the replays did advance the counter
      oa:step()
      assert.are_not.equal(pa[1].value:bytes(), pc[1].value:bytes())
    end)

    test("lutra_set_skip_weight_update is refused while capturing", function()
      lutra.set_skip_weight_update(DEV, false) -- the flag exists
      local dev = DEV == "cuda" and C.LUTRA_CUDA or C.LUTRA_CPU
      assert.are.equal(0, C.lutra_graph_begin(dev), ffi.string(C.lutra_last_error()))
      local st = C.lutra_set_skip_weight_update(dev, 1)
      local msg = ffi.string(C.lutra_last_error())
      C.lutra_graph_abort()
      assert.are_not.equal(0, st)
      assert.matches("lutra_set_skip_weight_update: not allowed while this thread captures a CUDA graph",
                     msg, 1, true)
    end)
  end)
else
  -- said, not silently left out: the CPU smoke test cannot capture
  pending("CUDA graph replays on " .. DEV .. " (skipped: need cuda, the device under test is " .. DEV .. ")")
end

-- The norm writing FP8 (lutra.norm_quantize) and nn.LayerNormLinear on the CPU backend.
--   norm_quantize  per recipe (delayed, current, mxfp8, 1x128 blocks), LayerNorm and RMSNorm,
--                  f32 and bf16: the codes, scale arrays, amax, scale and amax history are bit
--                  for bit those of nn.LayerNorm's output quantized by a second quantizer of the
--                  same recipe (the same order of operations), both copies, and y equals the
--                  norm's output; the outputs hold other codes (a quantization of another
--                  input) before each compared run, and delayed scaling is compared again after
--                  a scale update, so that a non-trivial scale is tested.
--   LayerNormLinear f32 without FP8: forward against an f64 reference (1e-5 relative to
--                  max|ref|), every gradient against central finite differences of it (h = 1e-4;
--                  1e-3 relative to max|num|: the f32 backward's rounding, the f64 truncation
--                  error ~h^2 far below); under each recipe and without one: output, input
--                  gradient and every parameter gradient bit for bit those of nn.LayerNorm
--                  followed by nn.Linear with the same parameters (the same operations), over two
--                  steps (delayed scaling's second step uses updated scales); with
--                  accumulate_main_grad, is_first_microbatch and an AdamW step likewise.
local lutra = require("lutra")
local nn = lutra.nn
local FB = require("spec.support.fp8_bytes")

local N = require("spec.support.norm_modules")
local same_tensor = N.same_tensor

describe("lutra.norm_quantize", function()
  for _, rc in ipairs(N.RECIPES) do
    for _, rms in ipairs { false, true } do
      for _, dtype in ipairs { "f32", "bf16" } do
        local shapes = { { 64, 96 } }
        if rc.name ~= "mxfp8" then shapes[2] = { 48, 80 } end -- partial blocks and tiles
        for _, shape in ipairs(shapes) do
          local name = string.format("%s %s %s [%d, %d]", rc.name, rms and "RMSNorm" or "LayerNorm",
                                     dtype, shape[1], shape[2])
          it(name .. ": bit for bit the norm's output quantized", function()
            local seed = math.random(1, 2 ^ 30)
            local h = shape[2]
            local zc = seed % 2 == 0
            local norm, g, b = N.new_norm(rms, h, { dtype = dtype, zero_centered_gamma = zc }, seed)
            local r = rc.make()
            local qf, qr = lutra.quantizer(r, "input"), lutra.quantizer(r, "input")
            local y = lutra.tensor(shape, dtype):fill(0 / 0)
            local opts = { rms = rms, zero_centered_gamma = zc, y = y }
            local function step(xseed)
              local x = lutra.tensor(shape, dtype):randn(xseed, 0.3, 1.7)
              local got = lutra.norm_quantize(qf, x, g, b, opts)
              local want = qr:quantize(norm:forward(x))
              return got, want
            end
            step(seed + 7) -- the outputs now hold another input's codes
            local got, want = step(seed + 8)
            FB.same_snapshot(FB.snapshot(qf, got, rc.cfg), FB.snapshot(qr, want, rc.cfg), name)
            same_tensor(y, norm:forward(lutra.tensor(shape, dtype):randn(seed + 8, 0.3, 1.7)),
                        name .. ": y")
            if rc.cfg.delayed then
              qf:update()
              qr:update()
              got, want = step(seed + 9)
              FB.same_snapshot(FB.snapshot(qf, got, rc.cfg), FB.snapshot(qr, want, rc.cfg),
                               name .. " after an update")
              local sc = qf:scale()
              assert.is_true(sc ~= 1, name .. ": the update left the scale at 1")
            end
          end)
        end
      end
    end
  end

  it("refuses bad inputs naming the call", function()
    local q = lutra.quantizer(lutra.recipe.delayed{}, "input")
    local x = lutra.tensor({ 32, 64 })
    local g, b = lutra.tensor({ 64 }), lutra.tensor({ 64 })
    local function fails(pat, ...)
      local ok, err = pcall(lutra.norm_quantize, ...)
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find(pat, 1, true), tostring(err))
    end
    fails("gamma must hold 64", q, x, lutra.tensor({ 32 }), b)
    fails("beta", q, x, g, nil)
    fails("y must have x's dtype", q, x, g, b, { y = lutra.tensor({ 32, 64 }, "bf16") })
    fails("multiples of 16", q, lutra.tensor({ 30, 64 }), g, b)
    fails("eps must be finite", q, x, g, b, { eps = -1 })
    fails("unknown option", q, x, g, b, { bogus = 1 })
    local q2 = lutra.quantizer(lutra.recipe.block{ block_dim = { input = 2 } }, "input")
    fails("128x128 tiles", q2, x, g, b)
  end)
end)

-- ---- LayerNormLinear ----------------------------------------------------------------------

local function ref_forward(x, g, beta, w, bias, rows, h, out, rms, zc, eps)
  return N.ref_linear(N.ref_norm(x, g, beta, rows, h, eps, rms, zc), w, bias, rows, h, out)
end

-- a LayerNormLinear and the unfused pair with the same parameters
local function pair(h, out, opts, seed)
  local rms = opts.normalization == "RMSNorm"
  local fused = nn.LayerNormLinear(h, out, opts)
  local norm = (rms and nn.RMSNorm or nn.LayerNorm)(h, { dtype = opts.dtype,
    zero_centered_gamma = opts.zero_centered_gamma, eps = opts.eps })
  local lin = nn.Linear(h, out, { dtype = opts.dtype, bias = opts.bias,
    accumulate_main_grad = opts.accumulate_main_grad })
  local pf = fused:parameters()
  local pn, pl = norm:parameters(), lin:parameters()
  local plain = {}
  for _, p in ipairs(pn) do plain[#plain + 1] = p end
  for _, p in ipairs(pl) do plain[#plain + 1] = p end
  N.tie_parameters(pf, plain, seed, 0.5)
  return fused, nn.Sequential(norm, lin), pf, plain, norm
end

describe("nn.LayerNormLinear", function()
  for _, rms in ipairs { false, true } do
    for _, zc in ipairs { false, true } do
      local norm_name = rms and "RMSNorm" or "LayerNorm"
      local tag = norm_name .. (zc and " zero_centered_gamma" or "")
      it(tag .. ": forward and backward against the f64 reference and finite differences",
         function()
        local rows, h, out, eps = 3, 8, 5, 1e-5
        local m = nn.LayerNormLinear(h, out, { normalization = norm_name, zero_centered_gamma = zc,
                                               seed = 5 })
        local p = m:parameters()
        for i = 1, #p do p[i].value:randn(100 + i, (i == 1 and not zc) and 1 or 0, 0.4) end
        local x = lutra.tensor({ rows, h }):randn(7, 0.2, 1.3)
        local rt = lutra.tensor({ rows, out }):randn(8)
        N.check_reference(m, x, rt, function(xv, v)
          local gv, bv = v[1], not rms and v[2] or nil
          local wv, biasv = v[rms and 2 or 3], v[rms and 3 or 4]
          return ref_forward(xv, gv, bv, wv, biasv, rows, h, out, rms, zc, eps)
        end, tag)
      end)
    end
  end

  for _, rc in ipairs(N.recipe_cases()) do
    for _, o in ipairs {
      { normalization = "LayerNorm", bias = true, dtype = "f32" },
      { normalization = "RMSNorm", bias = false, dtype = "bf16", zero_centered_gamma = true },
      { normalization = "LayerNorm", bias = true, dtype = "bf16", return_layernorm_output = true },
    } do
      local name = string.format("%s, %s %s%s%s", rc.name, o.normalization, o.dtype,
                                 o.bias and " bias" or "",
                                 o.return_layernorm_output and " return_layernorm_output" or "")
      it(name .. ": bit for bit nn.LayerNorm + nn.Linear, two steps", function()
        local seed = math.random(1, 2 ^ 30)
        local rows, h, out = 64, 96, 32
        local fused, plain, pf, pp, norm = pair(h, out, o, seed)
        local recipe = rc.make and rc.make() or nil
        for step = 1, 2 do
          local x = lutra.tensor({ rows, h }, o.dtype):randn(seed + 10 * step, 0.2, 1.5)
          local dy = lutra.tensor({ rows, out }, o.dtype):randn(seed + 10 * step + 1)
          local what = name .. " step " .. step
          N.same_step(fused, plain, pf, pp, recipe, x, dy, what)
          assert.are.equal(recipe ~= nil, fused:norm_fused(), what .. ": fused norm")
          if o.return_layernorm_output then
            same_tensor(fused:layernorm_output(), norm:forward(x), what .. ": ln output")
          end
        end
      end)
    end

    if rc.make then
      it(rc.name .. ": accumulate_main_grad, is_first_microbatch and AdamW as the unfused pair",
         function()
        local seed = math.random(1, 2 ^ 30)
        local rows, h, out = 32, 64, 96
        local o = { normalization = "LayerNorm", dtype = "bf16", accumulate_main_grad = true }
        local fused, plain, pf, pp = pair(h, out, o, seed)
        assert.is_not_nil(pf[3].main_grad)
        local of = lutra.optim.AdamW(fused, { lr = 1e-2 })
        local op = lutra.optim.AdamW(plain, { lr = 1e-2 })
        local recipe = rc.make()
        for step = 1, 3 do
          for micro = 1, 2 do
            local x = lutra.tensor({ rows, h }, "bf16"):randn(seed + 10 * step + micro)
            local dy = lutra.tensor({ rows, out }, "bf16"):randn(seed + 10 * step + micro + 5)
            for _, m in ipairs { fused, plain } do
              local s = lutra.autocast{ recipe = recipe }
              s:enter()
              m:forward(x, micro == 1)
              m:backward(dy, false)
              s:exit()
            end
          end
          for i = 1, #pf do
            if pf[i].main_grad then same_tensor(pf[i].main_grad, pp[i].main_grad, "main_grad " .. i)
            else same_tensor(pf[i].grad, pp[i].grad, "grad " .. i) end
          end
          of:step()
          op:step()
          for i = 1, #pf do same_tensor(pf[i].value, pp[i].value, "step " .. step .. " param " .. i) end
          fused:zero_grad()
          plain:zero_grad()
        end
      end)
    end
  end

  it("return_layernorm_output: the norm's output under FP8 too", function()
    local h, out = 64, 32
    local m = nn.LayerNormLinear(h, out, { return_layernorm_output = true })
    local norm = nn.LayerNorm(h)
    local x = lutra.tensor({ 32, h }):randn(3)
    local s = lutra.autocast{ recipe = lutra.recipe.delayed{} }
    s:enter()
    m:forward(x)
    s:exit()
    assert.is_true(m:norm_fused())
    same_tensor(m:layernorm_output(), norm:forward(x), "ln output")
    local plain = nn.LayerNormLinear(h, out)
    plain:forward(x)
    local ok, err = pcall(plain.layernorm_output, plain)
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("without return_layernorm_output", 1, true))
  end)

  it("a 128x128-tile input recipe runs the norm, then the core's quantization", function()
    local seed = math.random(1, 2 ^ 30)
    local o = { normalization = "LayerNorm", dtype = "f32" }
    local fused, plain = pair(128, 128, o, seed)
    local recipe = lutra.recipe.block{ block_dim = { input = 2 } }
    local x = lutra.tensor({ 128, 128 }):randn(seed)
    local ys = {}
    for i, m in ipairs { fused, plain } do
      local s = lutra.autocast{ recipe = recipe }
      s:enter()
      ys[i] = m:forward(x)
      s:exit()
    end
    assert.is_false(fused:norm_fused())
    same_tensor(ys[1], ys[2], "y")
  end)

  it("refuses bad inputs and options naming the call", function()
    local function fails(pat, f, ...)
      local ok, err = pcall(f, ...)
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find(pat, 1, true), tostring(err))
    end
    fails("unknown normalization", nn.LayerNormLinear, 8, 8, { normalization = "BatchNorm" })
    fails("unknown option", nn.LayerNormLinear, 8, 8, { bogus = true })
    fails("in_features", nn.LayerNormLinear, 0, 8)
    fails("eps must be >= 0", nn.LayerNormLinear, 8, 8, { eps = -1 })
    fails("dtype must be f32 or bf16", nn.LayerNormLinear, 8, 8, { dtype = "f16" })
    local m = nn.LayerNormLinear(16, 8)
    fails("expects 16", m.forward, m, lutra.tensor({ 4, 8 }))
    fails("dtype", m.forward, m, lutra.tensor({ 4, 16 }, "bf16"))
    fails("backward called before forward", m.backward, m, lutra.tensor({ 4, 8 }))
    m:forward(lutra.tensor({ 4, 16 }))
    fails("grad_output shape", m.backward, m, lutra.tensor({ 4, 9 }))
    m:forward(lutra.tensor({ 4, 16 }), { grad = false })
    fails("grad = false", m.backward, m, lutra.tensor({ 4, 8 }))
    local s = lutra.autocast{ recipe = lutra.recipe.mxfp8{} }
    s:enter()
    local ok, err = pcall(m.forward, m, lutra.tensor({ 4, 16 }))
    s:exit()
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("multiples of 32", 1, true), tostring(err))
  end)
end)

describe("the fused modules' C API refuses bad calls naming itself", function()
  local ffi, C = lutra.ffi, lutra.C
  local function c_fails(status, fn, pat, st)
    assert.are.equal(status, st, fn .. ": status")
    local msg = ffi.string(C.lutra_last_error())
    assert.is_truthy(msg:find(fn, 1, true), msg)
    assert.is_truthy(msg:find(pat, 1, true), msg)
  end
  it("constructors, accessors and norm_quantize", function()
    local box = ffi.new("lutra_module*[1]")
    local tbox = ffi.new("lutra_tensor*[1]")
    c_fails(C.LUTRA_EINVAL, "lutra_layernorm_linear_new", "desc is NULL",
            C.lutra_layernorm_linear_new(nil, box))
    local d = ffi.new("lutra_layernorm_linear_desc")
    C.lutra_layernorm_linear_defaults(d)
    d.in_features, d.out_features, d.normalization = 8, 8, 7
    c_fails(C.LUTRA_EINVAL, "lutra_layernorm_linear_new", "normalization 7",
            C.lutra_layernorm_linear_new(d, box))
    d.normalization, d.eps = 0, -1
    c_fails(C.LUTRA_EINVAL, "lutra_layernorm_linear_new", "eps must be finite",
            C.lutra_layernorm_linear_new(d, box))
    local md = ffi.new("lutra_layernorm_mlp_desc")
    C.lutra_layernorm_mlp_defaults(md)
    md.hidden, md.ffn_hidden, md.activation = 8, 8, 99
    c_fails(C.LUTRA_EINVAL, "lutra_layernorm_mlp_new", "99", C.lutra_layernorm_mlp_new(md, box))
    local lin = nn.Linear(4, 4)
    c_fails(C.LUTRA_EINVAL, "lutra_layernorm_linear_ln_output", "not a layernorm_linear",
            C.lutra_layernorm_linear_ln_output(lin, tbox))
    c_fails(C.LUTRA_EINVAL, "lutra_residual_new", "module", C.lutra_residual_new(nil, box))
    local x, g = lutra.tensor({ 16, 16 }), lutra.tensor({ 16 })
    c_fails(C.LUTRA_EINVAL, "lutra_norm_quantize", "quantizer",
            C.lutra_norm_quantize(nil, x, g, g, 1e-5, 0, 0, nil, tbox))
    local q = lutra.quantizer(lutra.recipe.delayed{}, "input")
    c_fails(C.LUTRA_EINVAL, "lutra_norm_quantize", "out is NULL",
            C.lutra_norm_quantize(q, x, g, g, 1e-5, 0, 0, nil, nil))
    c_fails(C.LUTRA_EINVAL, "lutra_norm_quantize", "y must not alias x",
            C.lutra_norm_quantize(q, x, g, g, 1e-5, 0, 0, x, tbox))
    -- a refused call leaves the quantizer working: the next call equals a fresh quantizer's
    local q2 = lutra.quantizer(lutra.recipe.delayed{}, "input")
    local xr = lutra.tensor({ 16, 16 }):randn(5)
    g:fill(1)
    local b = lutra.tensor({ 16 })
    FB.same_bytes(lutra.norm_quantize(q, xr, g, b):bytes(true),
                  lutra.norm_quantize(q2, xr, g, b):bytes(true), "after the refusals")
  end)
end)

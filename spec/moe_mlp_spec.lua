-- nn.MoEMLP (the mixture-of-experts feed-forward, src/lutra/moe_mlp.h) on the CPU backend:
--   * equals its pieces composed by hand as examples/train_moe.lua composes them (nn.LayerNorm or
--     nn.RMSNorm, lutra.moe.Router, lutra.moe.Dispatcher, nn.GroupedLinear -> activation ->
--     nn.GroupedLinear, lutra.add of the two gradient paths into the norm's), with the module's
--     weights copied in, bit for bit: output, input gradient and every parameter gradient, for
--     f32 and bf16, 2-, 3- and 4-dim inputs, gated and plain activations, with and without
--     the experts' biases; two steps each on fresh random inputs (new routing each);
--   * gives the gradients of central finite differences (f32, h = 1e-2) of sum(y * w), for the
--     input and for the router's weight (the path through the probabilities alone): bound
--     2e-2 relative to the largest gradient (the f32 rounding of the differences is ~1e-4 of
--     it, their O(h^2) error smaller); a coordinate whose perturbation changes the routing (the
--     loss is not differentiable there) is skipped, and at least half must be checked;
--   * under an FP8 autocast: the routing (probabilities, indices) is the high-precision one bit
--     for bit (the router Linear stays high precision), the output is not (the experts ran FP8);
--   * saves and loads (a model of another seed then gives the same output bit for bit), prints
--     its configuration, hands out its routing;
--   * refuses bad configurations and inputs naming the call and the reason.
-- Inputs come from a clock-seeded generator (spec/support/fresh_random.lua); failures name it.
local lutra = require("lutra")
local ffi = require("ffi")
local E = require("spec.support.errors")
local nn, moe, C = lutra.nn, lutra.moe, require("lutra.core").C
local rng = require("spec.support.fresh_random").new()

local function randn(shape, dtype)
  return lutra.tensor(shape, dtype or "f32"):randn(rng.int(1, 2 ^ 30), 0, 1)
end

local function assert_same(got, want, what)
  assert.are.same(got:dims(), want:dims(), what .. ": shape")
  if got:bytes() == want:bytes() then return end
  local g, w = got:to_table(), want:to_table()
  for i = 1, #w do
    if g[i] ~= w[i] then
      error(string.format("%s: element %d is %.9g, the composition gives %.9g (seed %d)", what, i,
                          g[i], w[i], rng.seed), 2)
    end
  end
end

local ACTIVATIONS = { gelu = nn.GELU, swiglu = nn.SwiGLU, relu = nn.ReLU, reglu = nn.ReGLU }
local GATED = { swiglu = true, reglu = true }

local function build(c, seed)
  return nn.MoEMLP(c.hidden, c.ffn, c.E, c.k, { normalization = c.norm, activation = c.act,
                                                bias = c.bias, dtype = c.dtype, seed = seed })
end

-- the pieces of module m of config c, with m's weights copied in
local function pieces_of(m, c)
  local o = { dtype = c.dtype, bias = c.bias }
  local p = {
    norm = (c.norm == "RMSNorm" and nn.RMSNorm or nn.LayerNorm)(c.hidden, { dtype = c.dtype }),
    router = moe.Router(c.hidden, c.E, c.k, { dtype = c.dtype }),
    disp = moe.Dispatcher(c.E),
    fc1 = nn.GroupedLinear(c.E, c.hidden, GATED[c.act] and 2 * c.ffn or c.ffn, o),
    act = ACTIVATIONS[c.act or "gelu"](),
    fc2 = nn.GroupedLinear(c.E, c.ffn, c.hidden, o),
  }
  local mine = {}
  for _, part in ipairs { p.norm, p.router.linear, p.fc1, p.fc2 } do
    for _, q in ipairs(part:parameters()) do mine[#mine + 1] = q end
  end
  local theirs = m:parameters()
  assert.are.equal(#mine, #theirs, "parameter count")
  for i, q in ipairs(theirs) do mine[i].value:copy(q.value) end
  return p, mine
end

local function hand_forward(p, x)
  local xn = p.norm:forward(x)
  local probs, idx = p.router:forward(xn)
  local xp, splits = p.disp:permute(xn, idx)
  local h = p.fc2:forward(p.act:forward(p.fc1:forward(xp, splits)), splits)
  return p.disp:unpermute(h, probs)
end

local function hand_backward(p, dy)
  local dh, dprobs = p.disp:unpermute_backward(dy)
  local dxp = p.fc1:backward(p.act:backward(p.fc2:backward(dh)))
  local dxn = lutra.add(p.disp:permute_backward(dxp), p.router:backward(dprobs))
  return p.norm:backward(dxn)
end

local CONFIGS = {
  { hidden = 16, ffn = 24, E = 4, k = 2, shape = { 2, 5, 16 } },
  { hidden = 12, ffn = 8, E = 6, k = 3, shape = { 17, 12 }, norm = "RMSNorm", act = "swiglu",
    bias = false },
  { hidden = 16, ffn = 16, E = 3, k = 1, shape = { 3, 4, 16 }, act = "relu", dtype = "bf16" },
  { hidden = 8, ffn = 12, E = 2, k = 2, shape = { 2, 2, 3, 8 }, act = "reglu", dtype = "bf16",
    norm = "RMSNorm" },
}

local function config_name(c)
  return string.format("%s, %s, %d of %d experts, x %s, %s", c.norm or "LayerNorm",
                       c.act or "gelu", c.k, c.E, table.concat(c.shape, "x"), c.dtype or "f32")
end

describe("nn.MoEMLP", function()
  for _, c in ipairs(CONFIGS) do
    it("equals its pieces composed by hand, bit for bit (" .. config_name(c) .. ")", function()
      local m = build(c, rng.int(1, 2 ^ 30))
      local p, mine = pieces_of(m, c)
      for step = 1, 2 do
        local x, dy = randn(c.shape, c.dtype), randn(c.shape, c.dtype)
        assert_same(m:forward(x), hand_forward(p, x), "y, step " .. step)
        assert_same(m:backward(dy), hand_backward(p, dy), "dx, step " .. step)
        for i, q in ipairs(m:parameters()) do
          assert_same(q.grad, mine[i].grad, "parameter " .. i .. "'s gradient, step " .. step)
        end
      end
    end)
  end

  -- sum(y * w) at the current inputs, and whether the routing is the one of indices0
  local function loss_and_routing(m, x, w, indices0)
    local y = m:forward(x):to_table()
    local s = 0
    for i = 1, #y do s = s + y[i] * w[i] end
    local _, idx = m:routing()
    return s, idx:bytes() == indices0
  end

  -- central differences of the loss in the coordinates of values (set by set) against grad.
  -- The top-k routing is piecewise constant: a coordinate whose steps of h flip a token's choice
  -- is tried again with smaller steps (down to 6e-4, still above f32's noise in the loss, a sum
  -- of ~100 terms of order 1), and left out when those flip it too
  local function check_fd(m, x, w, indices0, values, set, grad, what)
    local biggest = 0
    for i = 1, #grad do biggest = math.max(biggest, math.abs(grad[i])) end
    assert.is_true(biggest > 0, what .. ": the gradient is zero")
    local checked = 0
    for i = 1, #values do
      local v = values[i]
      local lp, same_p, lm, same_m, h
      for _, step in ipairs({ 1e-2, 2.5e-3, 6e-4 }) do
        h = step
        values[i] = v + h
        set(values)
        lp, same_p = loss_and_routing(m, x, w, indices0)
        values[i] = v - h
        set(values)
        lm, same_m = loss_and_routing(m, x, w, indices0)
        values[i] = v
        set(values)
        if same_p and same_m then break end
      end
      if same_p and same_m then
        checked = checked + 1
        local fd = (lp - lm) / (2 * h)
        if not (math.abs(fd - grad[i]) <= 2e-2 * biggest) then
          error(string.format("%s[%d] = %.6g, finite differences %.6g (seed %d)", what, i, grad[i],
                              fd, rng.seed), 2)
        end
      end
    end
    assert.is_true(checked >= #values / 2, string.format(
      "%s: only %d of %d coordinates kept their routing (seed %d)", what, checked, #values, rng.seed))
  end

  it("gives the input's and the router's gradients of finite differences", function()
    local c = { hidden = 8, ffn = 12, E = 4, k = 2, shape = { 3, 4, 8 } }
    local m = build(c, rng.int(1, 2 ^ 30))
    local x = randn(c.shape)
    local w = randn(c.shape):to_table()
    m:forward(x)
    local _, idx = m:routing()
    local indices0 = idx:bytes()
    local dx = m:backward(lutra.from_table(w, c.shape)):to_table()
    local router_w = m:parameters()[3] -- norm.weight, norm.bias, router.weight
    assert.are.same({ c.E, c.hidden }, router_w.value:dims())
    local dw = router_w.grad:to_table()
    local xv = x:to_table()
    check_fd(m, x, w, indices0, xv, function(v) x:set(v) end, dx, "dx")
    local wv = router_w.value:to_table()
    check_fd(m, x, w, indices0, wv, function(v) router_w.value:set(v) end, dw, "d router.weight")
  end)

  it("under an FP8 autocast runs the experts in FP8 and keeps the router in high precision", function()
    local c = { hidden = 16, ffn = 32, E = 4, k = 2, shape = { 4, 8, 16 } } -- FP8: 16-multiples
    local s = rng.int(1, 2 ^ 30)
    local hp, fp8 = build(c, s), build(c, s)
    local x = randn(c.shape)
    local want = hp:forward(x)
    local want_probs, want_idx = hp:routing()
    for _, recipe in ipairs { lutra.recipe.delayed(), lutra.recipe.current() } do
      local scope = lutra.autocast { recipe = recipe }
      scope:enter()
      local ok, y = pcall(function()
        local out = fp8:forward(x)
        fp8:backward(out)
        return out
      end)
      scope:exit() -- also after an error: later specs must not run inside it
      assert(ok, y)
      local probs, idx = fp8:routing()
      assert.are.equal(want_idx:bytes(), idx:bytes(), "the routing changed under autocast")
      assert.are.equal(want_probs:bytes(), probs:bytes(), "the probabilities changed")
      assert.are_not.equal(want:bytes(), y:bytes(), "the experts did not run FP8")
    end
  end)

  it("saves and loads, prints its configuration and hands out its routing", function()
    local c = CONFIGS[2]
    local a, b = build(c, rng.int(1, 2 ^ 30)), build(c, rng.int(1, 2 ^ 30))
    local x = randn(c.shape)
    local path = os.tmpname()
    lutra.save(path, { model = a })
    lutra.load(path, { model = b })
    os.remove(path)
    assert_same(b:forward(x), a:forward(x), "y after load")
    assert.are.equal("moe_mlp", a:kind())
    assert.are.equal("lutra.nn.MoEMLP(hidden=12, ffn_hidden=8, experts=6, top_k=3, RMSNorm, "
                     .. "swiglu, bias=false, f32, cpu)", tostring(a))
    local probs, idx, splits = a:routing()
    assert.are.same({ 17, 3 }, probs:dims())
    assert.are.same({ 17, 3 }, idx:dims())
    local total = 0
    for _, n in ipairs(splits:to_table()) do total = total + n end
    assert.are.equal(17 * 3, total)
    a = nil -- the routing's tensors keep the module alive
    collectgarbage()
    collectgarbage()
    assert.are.equal(17 * 3, #idx:to_table())
  end)

  it("allocates nothing in a warm training step, whatever the routing", function()
    local so = os.tmpname() .. ".so"
    assert.are.equal(0, os.execute("cc -shared -fPIC -O1 -o " .. so .. " spec/support/count_alloc.c"))
    -- the plain build of the library (the ASan one would take the allocations from ASan first)
    local lib = io.open("liblutra.so") and "liblutra.so" or error("build liblutra.so (make) first")
    local p = assert(io.popen(string.format("LUTRA_LIB=$PWD/%s LD_PRELOAD=%s luajit %s 2>&1", lib,
                                            so, "spec/support/alloc_moe_mlp.lua")))
    local out = p:read("*a")
    p:close()
    os.remove(so)
    local step, control = out:match("step=(%d+) control=(%d+)")
    assert.truthy(step, out)
    assert.are.equal(0, tonumber(step), out)
    assert.is_true(tonumber(control) >= 10, out)
  end)

  it("once destroyed, reports itself and the tensors it handed out as freed", function()
    local m = nn.MoEMLP(8, 8, 4, 2)
    local x = randn({ 3, 8 })
    local y = m:forward(x)
    local probs = m:routing()
    local part = nn.TransformerLayer(8, 8, 2, { moe = { experts = 2, top_k = 1 } }):part("mlp")
    collectgarbage()
    collectgarbage() -- the part keeps the layer's MoEMLP alive
    assert.are.same({ 1, 3, 8 }, part:forward(randn({ 1, 3, 8 })):dims())
    m:destroy()
    E.expect_error(function() probs:to_table() end, "lutra_tensor_get_f32", "was freed")
    E.expect_error(function() y:to_table() end, "lutra_tensor_get_f32", "was freed")
    E.expect_error(function() m:forward(x) end, "lutra_module_forward", "was freed")
    E.expect_error(function() m:routing() end, "lutra_moe_mlp_routing", "was freed")
  end)

  it("refuses bad configurations and inputs, naming the call and the reason", function()
    E.expect_error(function() nn.MoEMLP(16, 16, 2, 3) end, "lutra_moe_mlp_new",
                   "top_k = 3 must be in 1..experts (2)")
    E.expect_error(function() nn.MoEMLP(16, 16, 2, 0) end, "lutra.nn.MoEMLP", "top_k")
    E.expect_error(function() nn.MoEMLP(16, 16, 5000, 2) end, "lutra_moe_mlp_new",
                   "experts = 5000 is outside 1..4096")
    E.expect_error(function() nn.MoEMLP(16, 16, 4, 2, { activation = "mish" }) end,
                   "lutra.nn.MoEMLP", "activation")
    E.expect_error(function() nn.MoEMLP(16, 16, 4, 2, { topk = 2 }) end, "lutra.nn.MoEMLP",
                   "unknown option 'topk'")
    local d = ffi.new("lutra_moe_mlp_desc")
    C.lutra_moe_mlp_defaults(d)
    d.hidden, d.ffn_hidden, d.experts, d.top_k = 8, 8, 4, 0
    local box = ffi.new("lutra_module*[1]")
    E.expect_error(function() E.c_check(C.lutra_moe_mlp_new(d, box)) end, "lutra_moe_mlp_new",
                   "top_k = 0 must be in 1..experts (4)")
    d.top_k, d.device = 2, C.LUTRA_CUDA -- refused before the device is looked for
    E.expect_error(function() E.c_check(C.lutra_moe_mlp_new(d, box)) end, "lutra_moe_mlp_new",
                   "dtype f32 on a device")
    local m = nn.MoEMLP(16, 8, 4, 2)
    E.expect_error(function() m:backward(randn({ 3, 16 })) end, "lutra_moe_mlp_backward",
                   "before a forward with grad")
    E.expect_error(function() m:forward(randn({ 3, 15 })) end, "lutra_moe_mlp_forward",
                   "input must be [.., 16]")
    E.expect_error(function() m:forward(randn({ 16 })) end, "lutra_moe_mlp_forward",
                   "got 1 dims")
    E.expect_error(function() m:forward(randn({ 3, 16 }, "bf16")) end, "lutra_moe_mlp_forward",
                   "input dtype bf16 does not match the module's f32")
    local args = ffi.new("lutra_forward_args")
    C.lutra_forward_defaults(args)
    args.splits = lutra.tensor({ 4 }, "i32")
    E.expect_error(function()
      E.c_check(C.lutra_module_forward_ex(m, randn({ 3, 16 }), args, ffi.new("lutra_tensor*[1]")))
    end, "lutra_moe_mlp_forward", "routes its tokens itself")
    m:forward(randn({ 3, 16 }), { grad = false })
    E.expect_error(function() m:backward(randn({ 3, 16 })) end, "lutra_moe_mlp_backward",
                   "before a forward with grad")
    m:forward(randn({ 3, 16 }))
    E.expect_error(function() m:backward(randn({ 4, 16 })) end, "lutra_moe_unpermute_backward",
                   "dy must be [3, 16]")
    -- a refused forward changes nothing: the backward is still the last good forward's
    local s = rng.int(1, 2 ^ 30)
    local a, b = nn.MoEMLP(16, 16, 4, 2, { seed = s }), nn.MoEMLP(16, 16, 4, 2, { seed = s })
    local x, dy = randn({ 5, 16 }), randn({ 5, 16 })
    a:forward(x)
    E.expect_error(function() a:forward(randn({ 5, 12 })) end, "lutra_moe_mlp_forward", "input")
    b:forward(x)
    assert_same(a:backward(dy), b:backward(dy), "dx after a refused forward")
    E.expect_error(function() E.c_check(C.lutra_moe_mlp_routing(nn.Linear(4, 4), nil, nil, nil)) end,
                   "lutra_moe_mlp_routing", "not an MoE feed-forward")
    E.expect_error(function() nn.MoEMLP(4, 4, 2, 1):routing() end, "lutra_moe_mlp_routing",
                   "no forward has run")
  end)
end)

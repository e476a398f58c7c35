-- nn.DotProductAttention as a module (spec/attention_spec.lua checks its values): refused descs
-- and inputs name the call and the reason and change nothing (the last good forward's output
-- and its backward's gradients stay bit for bit), the backward's state rules, per-shape outputs
-- and the bounded plan cache, print, checkpoints, lifetimes under the garbage collector, the
-- C API called through ffi, and a training loop's LuaJIT trace.
local lutra = require("lutra")
local nn = lutra.nn
local ffi, C = lutra.ffi, lutra.C

local fresh = require("spec.support.fresh_random").new()
local SEED, random = fresh.seed, fresh.int
local function rand(shape, dtype) return lutra.tensor(shape, dtype or "f32"):randn(random(1, 2 ^ 30)) end

local function expect_error(fn, ...)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error")
  err = tostring(err)
  for _, want in ipairs { ... } do assert.truthy(err:find(want, 1, true), err) end
end

local function addr(t) return tonumber(ffi.cast("uintptr_t", t.data)) end

describe("nn.DotProductAttention refuses", function()
  it("bad descs, naming the reason", function()
    for _, c in ipairs {
      { function() return nn.DotProductAttention(4, 8, { num_gqa_groups = 3 }) end, "does not divide" },
      { function() return nn.DotProductAttention(4, 8, { num_gqa_groups = 8 }) end, "num_gqa_groups" },
      { function() return nn.DotProductAttention(0, 8) end, "num_heads" },
      { function() return nn.DotProductAttention(4, 0) end, "head_dim" },
      { function() return nn.DotProductAttention(4, 8, { dropout = 1 }) end, "dropout must be in [0, 1)" },
      { function() return nn.DotProductAttention(4, 8, { dropout = -0.1 }) end, "dropout" },
      { function() return nn.DotProductAttention(4, 8, { dropout = 0 / 0 }) end, "dropout" },
      { function() return nn.DotProductAttention(4, 8, { qkv_format = "bhsd" }) end, "qkv_format" },
      { function() return nn.DotProductAttention(4, 8, { attn_mask_type = "padding" }) end, "attn_mask_type" },
      { function() return nn.DotProductAttention(4, 8, { dtype = "e4m3" }) end, "dtype" },
      { function() return nn.DotProductAttention(4, 8, { dtype = "i32" }) end, "dtype" },
      { function() return nn.DotProductAttention(4, 8, { softmax_scale = math.huge }) end, "softmax_scale" },
      { function() return nn.DotProductAttention(4, 8, { device = "tpu" }) end, "device" },
      { function() return nn.DotProductAttention(4, 8, { heads = 2 }) end, "unknown option 'heads'" },
    } do
      local ok, err = pcall(c[1])
      assert.is_false(ok)
      err = tostring(err)
      -- the front's checks name lutra.nn.DotProductAttention, C's lutra_attention_new
      assert.truthy(err:find("lutra.nn.DotProductAttention", 1, true)
                    or err:find("lutra_attention_new", 1, true), err)
      assert.truthy(err:find(c[2], 1, true), err)
    end
    -- the C checks behind the Lua ones
    local d = ffi.new("lutra_attention_desc")
    local box = ffi.new("lutra_module*[1]")
    local function refused(field, value, want)
      C.lutra_attention_defaults(d)
      d.num_heads, d.head_dim = 4, 8
      d[field] = value
      assert.are.equal(C.LUTRA_EINVAL, C.lutra_attention_new(d, box))
      local msg = ffi.string(C.lutra_last_error())
      assert.truthy(msg:find("lutra_attention_new", 1, true), msg)
      assert.truthy(msg:find(want, 1, true), msg)
    end
    refused("num_gqa_groups", 3, "does not divide")
    refused("head_dim", 0, "head_dim")
    refused("dropout", 1, "dropout")
    refused("qkv_format", 2, "qkv_format")
    refused("causal", 2, "causal")
    refused("dtype", C.LUTRA_E4M3, "dtype")
    refused("device", C.LUTRA_CUDA, "f32 runs on the cpu only")
    assert.are.equal(C.LUTRA_EINVAL, C.lutra_attention_new(nil, box))
  end)

  it("bad inputs and bad grad_outputs, changing nothing", function()
    local B, T, H, Hkv, D = 2, 5, 4, 2, 8
    local m = nn.DotProductAttention(H, D, { num_gqa_groups = Hkv })
    local q, k, v, dout = rand { B, T, H, D }, rand { B, T, Hkv, D }, rand { B, T, Hkv, D },
                          rand { B, T, H, D }
    local out = m:forward(q, k, v)
    local out_before = out:to_table()
    local g = { m:backward(dout) }
    local g_before = { g[1]:to_table(), g[2]:to_table(), g[3]:to_table() }
    local function unchanged()
      assert.are.same(out_before, out:to_table())
      local again = { m:backward(dout) }
      for i = 1, 3 do assert.are.same(g_before[i], again[i]:to_table()) end
    end
    local where = "lutra_attention_forward"
    for _, c in ipairs {
      { { rand { B, T, H * D }, k, v }, "q must have 4 dims" },
      { { q, rand { B, T, Hkv * D }, v }, "k must have 4 dims" },
      { { q, k, rand { B, T, Hkv, D + 1 } }, "k and v have different shapes" },
      { { rand { B, T, H + 1, D }, k, v }, "q's heads and head_dim are 5 and 8" },
      { { rand { B, T, H, D + 1 }, k, v }, "q's heads and head_dim" },
      { { q, rand { B, T, 1, D }, rand { B, T, 1, D } }, "num_gqa_groups 2" },
      { { q, rand { B + 1, T, Hkv, D }, rand { B + 1, T, Hkv, D } }, "batch" },
      { { q, rand { B, T + 1, Hkv, D }, rand { B, T + 1, Hkv, D } }, "causal attention needs as many" },
      { { rand({ B, T, H, D }, "bf16"), k, v }, "q dtype bf16 does not match the module's f32" },
    } do
      expect_error(function() m:forward(c[1][1], c[1][2], c[1][3]) end, where, c[2])
      unchanged()
    end
    expect_error(function() m:forward(rand { B, T, (H + 2 * Hkv) * D + 1 }) end,
                 "lutra_module_forward", "packed input's last dim 65")
    expect_error(function() m:forward(rand { B, T, H, D }) end, "lutra_module_forward", "3 dims")
    expect_error(function() m:forward(q, k, v, { grad = 1 }) end, "grad must be a boolean")
    expect_error(function() m:forward(q, k, v, true) end, "must be a table")
    unchanged()
    expect_error(function() m:backward(rand { B, T, H, D + 1 }) end, "lutra_attention_backward",
                 "grad_output shape does not match")
    expect_error(function() m:backward(rand({ B, T, H, D }, "bf16")) end, "grad_output dtype bf16")
    expect_error(function() m:backward(rand { B, T, H, D + 1 }, false) end, "shape does not match")
    assert.is_nil(m:backward(dout, false)) -- input_grad = false: nothing returned
    unchanged()
    -- the packed kind's, input_grad = false checked as well
    local x = rand { B, T, (H + 2 * Hkv) * D }
    m:forward(x)
    expect_error(function() m:backward(rand { B, T, H * D + 1 }, false) end,
                 "lutra_module_backward", "shape does not match")
    assert.is_nil(m:backward(rand { B, T, H * D }, false))
  end)

  it("a backward before a forward, after an inference forward, or of the other kind", function()
    local m = nn.DotProductAttention(2, 4)
    local q = rand { 1, 3, 2, 4 }
    expect_error(function() m:backward(q) end, "lutra_module_backward", "backward called before forward")
    local y = m:forward(q, q, q, { grad = false })
    assert.are.same({ 1, 3, 2, 4 }, y:dims())
    expect_error(function() m:backward(q) end, "grad = false (inference)")
    -- the other kind's backward, as C sees it
    m:forward(rand { 1, 3, 2 * 4 * 3 })
    local g = ffi.new("lutra_tensor*[3]")
    assert.are.equal(C.LUTRA_ESTATE, C.lutra_attention_backward(m, rand { 1, 3, 8 }, g, g + 1, g + 2))
    assert.truthy(ffi.string(C.lutra_last_error()):find("its backward is lutra_module_backward", 1, true))
    m:forward(q, q, q)
    assert.are.equal(C.LUTRA_ESTATE, C.lutra_module_backward(m, q, g))
    assert.truthy(ffi.string(C.lutra_last_error()):find("its backward is lutra_attention_backward", 1, true))
    -- another module kind
    assert.are.equal(C.LUTRA_EINVAL, C.lutra_attention_forward(nn.Linear(4, 4), q, q, q, g))
    assert.truthy(ffi.string(C.lutra_last_error()):find("not a dot_product_attention", 1, true))
    expect_error(function() nn.Linear(4, 4):forward(q, q, q) end, "not a dot_product_attention")
  end)
end)

describe("nn.DotProductAttention as a module", function()
  it("keeps outputs per shape and at most 4 plans, building nothing for a known shape", function()
    local m = nn.DotProductAttention(2, 4, { attn_mask_type = "no_mask" })
    local function run(T)
      local q = rand { 1, T, 2, 4 }
      local out = m:forward(q, q, q)
      m:backward(out)
      return addr(out)
    end
    local a3, a5 = run(3), run(5)
    assert.are_not.equal(a3, a5)
    for _ = 1, 3 do
      assert.are.equal(a3, run(3))
      assert.are.equal(a5, run(5))
    end
    assert.are.same({ 2, true }, { m:plans() })
    for T = 6, 11 do run(T) end
    assert.are.equal(4, (m:plans()))
    run(3)
    assert.are.equal(4, (m:plans()))
  end)

  it("prints its configuration and has no parameters", function()
    local m = nn.DotProductAttention(8, 64, { num_gqa_groups = 2, attn_mask_type = "no_mask",
                                              qkv_format = "sbhd", dropout = 0.125, dtype = "bf16" })
    assert.are.equal("lutra.nn.DotProductAttention(heads=8, head_dim=64, gqa_groups=2, no_mask, "
                     .. "sbhd, scale=0.125, dropout=0.125, bf16, cpu)", tostring(m))
    assert.are.equal("dot_product_attention", m:kind())
    assert.are.same({}, m:parameters())
    local seq = nn.Sequential(nn.Linear(4, 12), nn.DotProductAttention(1, 4))
    assert.truthy(tostring(seq):find("(2): lutra.nn.DotProductAttention(heads=1, head_dim=4, "
                                     .. "gqa_groups=1, causal, bshd, scale=0.5", 1, true), tostring(seq))
    expect_error(function() nn.Linear(4, 4):rng_state() end, "Linear has no method 'rng_state'",
                 "DotProductAttention")
  end)

  it("saves and loads in a checkpoint of a tree containing it", function()
    local path = os.tmpname()
    local net = nn.Sequential(nn.Linear(8, 24, { seed = 1 }), nn.DotProductAttention(2, 4),
                              nn.Linear(8, 8, { seed = 2 }))
    lutra.save(path, { model = net })
    local fresh = nn.Sequential(nn.Linear(8, 24, { seed = 3 }), nn.DotProductAttention(2, 4),
                                nn.Linear(8, 8, { seed = 4 }))
    lutra.load(path, { model = fresh })
    os.remove(path)
    local x = rand { 2, 3, 8 }
    assert.are.same(net:forward(x):to_table(), fresh:forward(x):to_table())
  end)

  it("outputs keep the module alive after its last reference is gone, and fail cleanly after "
     .. "destroy", function()
    local q = rand { 1, 4, 2, 4 }
    local want = nn.DotProductAttention(2, 4):forward(q, q, q):to_table()
    local m = nn.DotProductAttention(2, 4)
    local out = m:forward(q, q, q)
    local dq, dk, dv = m:backward(out)
    m = nil -- luacheck: ignore
    collectgarbage()
    collectgarbage()
    assert.are.same(want, out:to_table())
    dq:to_table()
    local m2 = nn.DotProductAttention(2, 4)
    local o2 = m2:forward(q, q, q)
    local g2 = m2:backward(o2)
    m2:destroy()
    expect_error(function() o2:to_table() end, "was freed")
    expect_error(function() g2:to_table() end, "was freed")
    expect_error(function() m2:forward(q, q, q) end, "was freed")
    -- an input freed between forward and backward
    local m3 = nn.DotProductAttention(2, 4)
    local q3 = rand { 1, 4, 2, 4 }
    m3:forward(q3, q, q)
    q3 = nil -- luacheck: ignore
    collectgarbage()
    local g3 = m3:backward(q) -- the module held q3's buffers
    assert.are.same({ 1, 4, 2, 4 }, g3:dims())
    assert.is_not_nil(dk)
    assert.is_not_nil(dv)
  end)

  it("a forward/backward loop compiles as a LuaJIT trace", function()
    require("spec.support.jit_trace").assert_compiles("spec/support/jit_attention_loop.lua")
  end)
end)

-- Methods per module kind (lua/lutra/module_methods.lua): every kind of module C has
-- (read from src/: the `.kind = "..."` of each module's ops table) is defined in Lua; every
-- constructor of lutra.nn makes a module whose methods are the shared ones and its kind's own;
-- a method of another kind is a Lua error naming the kind and the method (not C's error from
-- inside the call), and each kind's own methods reach C without a kind mismatch. Sequential
-- children, C-made handles and freed modules get the right answer too.
local lutra = require("lutra")
local methods = require("lutra.module_methods")
local I = require("spec.support.install_tree")
local nn = lutra.nn

-- the kinds C gives (lutra_module_kind), read from every C file under src/
local function c_kinds()
  local _, files = I.sh("find src -name '*.c'")
  local kinds = {}
  for path in files:gmatch("[^\n]+") do
    local src = I.read(path)
    for kind in src:gmatch("[^%w_.>]%.kind = \"([%w_]+)\"") do kinds[kind] = true end
    for name in src:gmatch("OPS%([%w_]+, \"([%w_]+)\"%)") do kinds[name] = true end
    for name in src:gmatch("NORM_OPS%(\"([%w_]+)\"%)") do kinds[name] = true end
  end
  return kinds
end

-- arguments of each constructor of lutra.nn: a constructor missing here fails the spec
local x8 = function() return lutra.tensor({ 4, 8 }):randn(1) end
local args = {
  Linear = { 8, 8 }, GroupedLinear = { 2, 8, 8 }, LayerNormLinear = { 8, 8 },
  LayerNormMLP = { 8, 8 }, LayerNorm = { 8 }, RMSNorm = { 8 }, GELU = {}, ReLU = {}, SiLU = {},
  QuickGELU = {}, SquaredReLU = {}, SwiGLU = {}, GeGLU = {}, ReGLU = {}, Tanh = {},
  Sequential = { function() return nn.Linear(8, 8) end, function() return nn.GELU() end },
  Residual = { function() return nn.Linear(8, 8) end }, Embedding = { 16, 8 },
  RotaryEmbedding = { 8 },
  DotProductAttention = { 2, 4 },
  MultiheadAttention = { 8, 2 }, TransformerLayer = { 8, 16, 2 }, MoEMLP = { 8, 16, 4, 2 },
}

local function make(name)
  local a = {}
  for i, v in ipairs(args[name]) do a[i] = type(v) == "function" and v() or v end
  return nn[name](unpack(a))
end

-- one module of every kind lutra.nn's constructors make (kind -> module)
local function every_kind()
  local made = {}
  for name, f in pairs(nn) do
    if type(f) == "function" and name:match("^%u") and not name:match("Loss$") then
      assert(args[name], "no arguments for lutra.nn." .. name .. " in this spec")
      local m = make(name)
      made[m:kind()] = m
    end
  end
  made.gelu_erf = nn.GELU { approximate = "none" }
  return made
end

-- arguments a call of each kind's own method takes: a method missing here fails the spec
local sample = { quantizer = { "input" }, quantized = { "input" }, fusions = {},
                 layernorm_output = {}, norm_fused = {}, mlp_fusions = {},
                 set_splits = { { 2, 2 } }, check_splits = {}, set_path = { "grouped" },
                 set_graph_capacity = { 4 }, graph_stats = {}, num_gemms = {},
                 check = {}, set_offset = { 0 }, settings = {},
                 apply_qkv = { lutra.tensor({ 1, 2, 24 }), 1, 1 },
                 rng_state = {}, set_rng_state = { 1, 0 }, plans = {}, part = { "qkv" },
                 routing = {}, fp8_state = {} }

-- every kind's own methods: the union (name -> function) and per kind (kind -> name -> true)
local function own_methods()
  local all, of = {}, {}
  for kind, entry in pairs(methods.kinds) do
    of[kind] = {}
    for name, f in pairs(entry.methods) do
      assert(sample[name], "no sample arguments for method '" .. name .. "' in this spec")
      all[name] = f
      of[kind][name] = true
    end
  end
  return all, of
end

local function error_of(f, ...)
  local ok, err = pcall(f, ...)
  return not ok and tostring(err) or nil
end

describe("module methods per kind", function()
  it("defines every kind C has, and only those", function()
    local c = c_kinds()
    assert.is_true(c.linear and c.sequential and c.grouped_linear and c.gelu and c.layernorm
                   and true or false, "the C kinds were not found in src/")
    for kind in pairs(c) do
      assert(methods.kinds[kind], "C kind '" .. kind .. "' has no definition in Lua")
    end
    for kind in pairs(methods.kinds) do
      assert(c[kind], "Lua defines kind '" .. kind .. "', which C does not have")
    end
  end)

  it("lutra.nn's constructors make every kind but the tensor-parallel one", function()
    local made = every_kind()
    for kind in pairs(c_kinds()) do
      -- rotary_qkv: a MultiheadAttention's inner RoPE step, never handed to Lua; moe_router:
      -- an MoEMLP's router (its checkpoint child, not a part handed out)
      if kind ~= "linear_parallel" and kind ~= "rotary_qkv" and kind ~= "moe_router" then
        assert(made[kind], "no constructor made a " .. kind)
      end
    end
  end)

  it("gives each kind its own methods and the shared ones, and a clear error for others'", function()
    local all, of = own_methods()
    local shared = { "forward", "backward", "parameters", "zero_grad", "kind", "destroy" }
    local checked = 0
    for kind, m in pairs(every_kind()) do
      local name = methods.kinds[kind].name
      for _, method in ipairs(shared) do assert.is_function(m[method]) end
      assert.is_table(m:parameters())
      m:zero_grad()
      assert.is_string(tostring(m))
      for method, f in pairs(all) do
        -- the Lua tables agree with C: a kind's own method is not refused for the module's
        -- kind (maybe for its state), another kind's method C would refuse for it
        local c_err = error_of(f, m, unpack(sample[method]))
        local mismatch = c_err and c_err:match("module is a [%w_]+, not a")
        if of[kind][method] then
          assert.is_function(m[method])
          assert.is_nil(mismatch, c_err)
        else
          assert.is_not_nil(mismatch, kind .. ": C takes " .. method .. " (" .. tostring(c_err) .. ")")
          local err = error_of(function() return m[method] end)
          assert.is_not_nil(err, kind .. " has " .. method)
          assert.matches(name .. " has no method '" .. method .. "'", err, 1, true)
        end
        checked = checked + 1
      end
      local err = error_of(function() return m.no_such_method end)
      assert.matches(name .. " has no method 'no_such_method'", err, 1, true)
    end
    assert.is_true(checked >= 12 * 15, checked .. " pairs checked")
  end)

  it("points the error at the caller's line and names the method's kind", function()
    local lin = nn.Linear(8, 8)
    local line = debug.getinfo(1, "l").currentline + 1
    local err = error_of(function() lin:set_splits({ 4, 4 }) end)
    assert.matches("module_methods_spec.lua:" .. line .. ": Linear has no method 'set_splits' "
                   .. "(it is a method of GroupedLinear)", err, 1, true)
  end)

  it("gives a Sequential's children (handles made from C) their kind's methods", function()
    local g = nn.GroupedLinear(2, 8, 8)
    local seq = nn.Sequential(nn.Linear(8, 8), g, nn.GELU())
    assert.are.equal(2, seq[2]:num_gemms())
    seq[2]:set_splits({ 2, 2 })
    local y = seq:forward(x8())
    assert.are.same({ 4, 8 }, { tonumber(y.shape[0]), tonumber(y.shape[1]) })
    assert.is_nil(seq[1]:quantized("input")) -- a Linear child: high precision, no FP8 input
    assert.matches("Linear has no method 'num_gemms'",
                   error_of(function() return seq[1]:num_gemms() end), 1, true)
    assert.matches("GELU has no method 'fusions'",
                   error_of(function() return seq[3]:fusions() end), 1, true)
    -- a cast of the same C module (as a host hands one over) finds its kind from C
    local raw = lutra.ffi.cast("lutra_module *", g)
    assert.are.equal(2, raw:num_gemms())
    assert.matches("GroupedLinear cannot be indexed by 1",
                   error_of(function() return lutra.ffi.cast("lutra_module &", g)[1] end), 1, true)
  end)

  it("leaves a freed module's calls to C, which names it freed", function()
    local g = nn.GroupedLinear(2, 8, 8)
    g:destroy()
    assert.matches("module was freed", error_of(function() return g:num_gemms() end), 1, true)
    local fresh = nn.Linear(8, 8)
    local handle = lutra.ffi.cast("lutra_module *", fresh)
    fresh:destroy()
    assert.matches("module was freed", error_of(function() return handle:quantizer("input") end),
                   1, true)
  end)

  it("compiles to a LuaJIT trace when a loop calls kind methods every step", function()
    require("spec.support.jit_trace").assert_compiles("spec/support/jit_kind_methods_loop.lua")
  end)

  it("gives a tensor-parallel Linear the shared methods only", function()
    if not lutra.dist.available() then
      pending("skipped: liblutra was built without MPI")
      return
    end
    -- its own process: MPI starts as a singleton there
    local code = [[
      local lutra = require("lutra")
      lutra.dist.init()
      local m = lutra.nn.Linear(8, 8, { parallel_mode = "column", tp_group = lutra.dist.world() })
      assert(m:kind() == "linear_parallel", m:kind())
      assert(type(m.forward) == "function")
      local ok, err = pcall(function() return m:quantizer("input") end)
      print(ok, err)
      m:destroy()
      lutra.dist.finalize()
    ]]
    local ok, out = require("spec.support.shell").luajit_chunk(code)
    assert(ok, out)
    assert.matches("Linear (tensor parallel) has no method 'quantizer'", out, 1, true)
  end)
end)

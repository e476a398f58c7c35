-- The two lifetime verbs (lutra.h's conventions): lutra_X_unref drops the caller's reference
-- (the garbage collector's verb in Lua), lutra_X_destroy frees the buffers now (obj:destroy()).
-- Every object kind with :destroy() answers any later call with "was freed" naming the call, and
-- the collector then takes it without a crash; the 0.1 names (lutra/deprecated.h) still run,
-- only under their deprecation; no public declaration and no Lua method uses the old verbs.
local lutra = require("lutra")
local nn, moe = lutra.nn, lutra.moe
local ffi, C = lutra.ffi, lutra.C
local E = require("spec.support.errors")
local sh = require("spec.support.shell").sh
local read = require("spec.support.install_tree").read
local expect_error = E.expect_error

local function full_gc()
  collectgarbage()
  collectgarbage()
end

local function x16() return lutra.tensor({ 16, 16 }):randn(math.random(1, 2 ^ 30)) end

-- { kind, make(), a call after destroy, the C call its error names, the destroy call }
local kinds = {
  { "tensor", function() return x16() end, function(t) t:fill(1) end, "lutra_tensor_fill",
    "lutra_tensor_destroy" },
  { "recipe", function() return lutra.recipe.current {} end,
    function(r) lutra.quantizer(r, "input") end, "lutra_quantizer_new", "lutra_recipe_destroy" },
  { "quantizer", function() return lutra.quantizer(lutra.recipe.current {}, "input") end,
    function(q) q:quantize(x16()) end, "lutra_quantize", "lutra_quantizer_destroy" },
  { "Linear", function() return nn.Linear(16, 16) end, function(m) m:forward(x16()) end,
    "lutra_module_forward", "lutra_module_destroy" },
  { "Sequential", function() return nn.Sequential(nn.Linear(16, 16), nn.GELU()) end,
    function(m) m:forward(x16()) end, "lutra_module_forward", "lutra_module_destroy" },
  { "loss", function() return nn.MSELoss() end, function(l) l:forward(x16(), x16()) end,
    "lutra_loss_forward", "lutra_loss_destroy" },
  { "optimizer", function() return lutra.optim.SGD(nn.Linear(16, 16), { lr = 0.1 }) end,
    function(o) o:step() end, "lutra_optim_step", "lutra_optim_destroy" },
  { "TopK", function() return moe.TopK(6, 2) end,
    function(r) r:forward(lutra.tensor({ 8, 6 }):randn(3)) end, "lutra_moe_router_forward",
    "lutra_moe_router_destroy" },
  { "Dispatcher", function() return moe.Dispatcher(4) end, function(d) d:row_map() end,
    "lutra_moe_row_map", "lutra_moe_dispatch_destroy" },
  { "autocast scope", function() return lutra.autocast { recipe = lutra.recipe.current {} } end,
    function(s) s:enter() end, "lutra_autocast_enter", "lutra_autocast_destroy" },
}

describe("obj:destroy()", function()
  for _, k in ipairs(kinds) do
    local kind, make, use, call, destroy_call = k[1], k[2], k[3], k[4], k[5]
    it(kind .. ": a call after destroy reports 'was freed', naming the call", function()
      local obj = make()
      obj:destroy()
      expect_error(function() use(obj) end, call, "was freed")
      expect_error(function() obj:destroy() end, destroy_call, "was freed")
      obj = nil -- luacheck: ignore (the collector takes the destroyed shell next)
      full_gc()
    end)
  end

  it("Router (a Linear and a TopK): a forward after destroy reports 'was freed'", function()
    local r = moe.Router(16, 4, 2)
    r:destroy()
    expect_error(function() r:forward(x16()) end, "lutra_module_forward", "was freed")
    r = nil -- luacheck: ignore
    full_gc()
  end)

  it("an output of a destroyed module is freed, and the collector takes both", function()
    local m = nn.Linear(16, 16)
    local y = m:forward(x16())
    m:destroy()
    expect_error(function() y:to_table() end, "lutra_tensor_get_f32", "was freed")
    m, y = nil, nil -- luacheck: ignore
    full_gc()
  end)
end)

describe("lutra_X_unref", function()
  local box = ffi.new("lutra_tensor*[1]")
  local shape = ffi.new("int64_t[2]", 16, 16)

  local function raw_output(m)
    assert.are.equal(0, C.lutra_module_forward(m, x16(), 1, box))
    return box[0]
  end

  it("refuses an owner's tensor the caller never retained, and changes nothing", function()
    local m = nn.Linear(16, 16)
    local y = raw_output(m)
    assert.are.equal(C.LUTRA_ESTATE, C.lutra_tensor_unref(y))
    assert.are.equal("lutra_tensor_unref: tensor is owned by a module or quantizer and is freed " ..
                     "with it", ffi.string(C.lutra_last_error()))
    assert.are.equal(1, y.refs)
    assert.are.equal(0, y.held)
    assert.are.equal(C.LUTRA_ESTATE, C.lutra_tensor_destroy(y))
    assert.are.equal(0, C.lutra_tensor_fill(y, 1)) -- still the module's, still usable
  end)

  it("drops a reference the caller retained; the shell outlives its owner as 'was freed'", function()
    local m = nn.Linear(16, 16)
    local y = raw_output(m)
    C.lutra_tensor_retain(y)
    C.lutra_tensor_retain(y)
    assert.are.equal(0, C.lutra_tensor_unref(y))
    assert.are.equal(1, y.held)
    m:destroy()
    assert.are.equal(C.LUTRA_ESTATE, C.lutra_tensor_fill(y, 1))
    assert.is_truthy(ffi.string(C.lutra_last_error()):find("was freed", 1, true))
    assert.are.equal(0, C.lutra_tensor_unref(y)) -- the last reference: the shell goes
    assert.are.equal(C.LUTRA_ESTATE, C.lutra_tensor_unref(raw_output(nn.Linear(16, 16))))
  end)

  it("refuses a module's quantizer the caller never retained", function()
    local m = nn.Linear(16, 16)
    lutra.autocast { recipe = lutra.recipe.current {} }:run(function() m:forward(x16()) end)
    local qbox = ffi.new("lutra_quantizer*[1]")
    assert.are.equal(0, C.lutra_linear_quantizer(m, C.LUTRA_ROLE_INPUT, qbox))
    assert.are_not.equal(nil, qbox[0])
    assert.are.equal(C.LUTRA_ESTATE, C.lutra_quantizer_unref(qbox[0]))
    assert.are.equal("lutra_quantizer_unref: quantizer is owned by a module and is freed with it",
                     ffi.string(C.lutra_last_error()))
    C.lutra_quantizer_retain(qbox[0])
    assert.are.equal(0, C.lutra_quantizer_unref(qbox[0]))
    assert.are.equal(C.LUTRA_ESTATE, C.lutra_quantizer_unref(qbox[0])) -- that one is gone
  end)

  it("of a tensor the caller made frees it; NULL is a no-op", function()
    assert.are.equal(0, C.lutra_tensor_new(C.LUTRA_F32, 2, shape, x16().device, box))
    assert.are.equal(0, C.lutra_tensor_unref(box[0]))
    assert.are.equal(0, C.lutra_tensor_unref(nil))
    assert.are.equal(0, C.lutra_module_unref(nil))
  end)
end)

-- the 0.1 names, exported for one version (lutra/deprecated.h); LuaJIT's cdef leaves them out
local old_names = {
  "autocast_free", "autocast_release", "grad_sync_free", "graph_free", "graph_release",
  "group_free", "loss_free", "loss_release", "module_free", "module_release",
  "moe_dispatch_free", "moe_dispatch_release", "moe_router_free", "moe_router_release",
  "optim_free", "optim_release", "quantizer_free", "quantizer_release", "recipe_free",
  "recipe_release", "tensor_free", "tensor_release",
}

describe("the 0.1 lifetime names", function()
  local declared = false
  local function declare()
    if declared then return end
    ffi.cdef [[
      int lutra_tensor_free(lutra_tensor *t);
      int lutra_tensor_release(lutra_tensor *t);
      int lutra_module_free(lutra_module *m);
      int lutra_module_release(lutra_module *m);
      int lutra_quantizer_free(lutra_quantizer *q);
    ]]
    declared = true
  end
  local box = ffi.new("lutra_tensor*[1]")
  local shape = ffi.new("int64_t[2]", 16, 16)

  it("are not in LuaJIT's cdef", function()
    local cdef = require("lutra.cdef")
    for _, name in ipairs(old_names) do
      assert.is_nil(cdef:find("lutra_" .. name .. "%s*%("), name)
    end
  end)

  it("are all exported by the library", function()
    local lib = io.open("liblutra.so", "rb")
    if not lib then return pending("liblutra.so is not built") end
    lib:close()
    local ok, syms = sh("nm -D --defined-only liblutra.so")
    assert(ok, syms)
    for _, name in ipairs(old_names) do
      assert.is_truthy(syms:find("lutra_" .. name .. "\n", 1, true), "lutra_" .. name)
    end
  end)

  it("still do what their new names do", function()
    declare()
    assert.are.equal(0, C.lutra_tensor_new(C.LUTRA_F32, 2, shape, x16().device, box))
    local t = box[0]
    assert.are.equal(0, C.lutra_tensor_release(t))
    assert.are.equal(C.LUTRA_ESTATE, C.lutra_tensor_fill(t, 1))
    assert.are.equal("lutra_tensor_fill: tensor was freed", ffi.string(C.lutra_last_error()))
    assert.are.equal(0, C.lutra_tensor_free(t))
    local m = nn.Linear(16, 16)
    assert.are.equal(0, C.lutra_module_release(m))
    expect_error(function() m:forward(lutra.tensor({ 16, 16 })) end, "lutra_module_forward",
                 "was freed")
    -- the refusal comes through too, under the new name
    local y = ffi.new("lutra_tensor*[1]")
    local n = nn.Linear(16, 16)
    assert.are.equal(0, C.lutra_module_forward(n, x16(), 1, y))
    assert.are.equal(C.LUTRA_ESTATE, C.lutra_tensor_free(y[0]))
    assert.is_truthy(ffi.string(C.lutra_last_error()):find("^lutra_tensor_unref: tensor is owned"))
  end)

  it("compile in C only under a deprecation warning naming the new name", function()
    local src = os.tmpname() .. ".c"
    local f = assert(io.open(src, "w"))
    f:write('#include "lutra.h"\nint main(void) { return lutra_tensor_free(0); }\n')
    f:close()
    local function cc(flags)
      local _, out, status = sh(string.format("cc -std=c11 -Wall -Wextra %s -Isrc -fsyntax-only %s",
                                              flags, src))
      return status, out
    end
    local rc, out = cc("")
    assert.are.equal(0, rc, out)
    assert.is_truthy(out:find("deprecated", 1, true), out)
    assert.is_truthy(out:find("lutra_tensor_unref", 1, true), out)
    rc, out = cc("-Werror")
    assert.are_not.equal(0, rc, out)
    rc, out = cc("-Werror -DLUTRA_NO_DEPRECATED")
    assert.are_not.equal(0, rc, out) -- the old name is not declared at all
    os.remove(src)
  end)
end)

describe("the verbs in the public API", function()
  it("no public header but lutra/deprecated.h declares lutra_*_free or lutra_*_release", function()
    local p = io.popen("ls src/lutra.h src/lutra/*.h")
    local n = 0
    for path in p:lines() do
      n = n + 1
      if path ~= "src/lutra/deprecated.h" then
        -- declarations: the name followed by its parameter list
        for name in read(path):gmatch("(lutra_[%w_]+)%s*%(") do
          assert.is_nil(name:match("_free$") or name:match("_release$"), path .. ": " .. name)
        end
      end
    end
    p:close()
    assert.is_true(n > 20)
    for _, name in ipairs(old_names) do
      assert.is_truthy(read("src/lutra/deprecated.h"):find("lutra_" .. name .. "(", 1, true), name)
    end
  end)

  it("no Lua object has a free method; every one :destroy() ran on has destroy", function()
    local types = { "lutra_tensor", "lutra_quantizer", "lutra_recipe", "lutra_loss", "lutra_optim",
                    "lutra_moe_router", "lutra_moe_dispatch", "lutra_graph", "lutra_autocast",
                    "lutra_group", "lutra_grad_sync" }
    for _, ty in ipairs(types) do
      local p = ffi.cast(ty .. "*", nil) -- method lookup only: nothing is dereferenced
      assert.is_false(pcall(function() return p.free end), ty .. " has free")
    end
    for _, ty in ipairs { "lutra_graph" } do -- the one kind the spec above cannot make on the cpu
      assert.are.equal("function", type(ffi.cast(ty .. "*", nil).destroy))
    end
    for _, k in ipairs(kinds) do
      local obj = k[2]()
      assert.is_false(pcall(function() return obj.free end) and obj.free ~= nil, k[1] .. " has free")
      assert.are.equal("function", type(obj.destroy), k[1])
    end
    assert.is_nil(moe.Router(16, 4, 2).free)
    -- and no front file defines one (a method added later on a Lua table included)
    local p = io.popen("ls lua/lutra/*.lua")
    for path in p:lines() do
      local src = read(path)
      assert.is_nil(src:match("function [%w_]+[:.]free%s*%("), path)
      assert.is_nil(src:match("[^%w_]free%s*=%s*function"), path)
    end
    p:close()
  end)
end)

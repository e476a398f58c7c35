-- Checkpoint names per module kind (README "Checkpoints"), read back from the file's safetensors
-- header: every parameter and every quantizer's state of each kind is in the file under the
-- documented name, with its shape, and nothing else is; a fresh model of the same kind loads the
-- file and saves the same bytes. A GroupedLinear's file holds each expert's own amax history.
-- A module kind without a checkpoint entry makes lutra.save and lutra.load fail naming it.
-- (Resume of these kinds in a new process: spec/checkpoint_resume_spec.lua.)
local lutra = require("lutra")
local ffi = require("ffi")
local nn = lutra.nn

local H, F, ROWS, HIST = 32, 32, 32, 4

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- {name = {dtype =, shape = "32,32", values = {...} (F32 only)}}, from the file's own header
local function contents(path)
  local bytes = read(path)
  local n = 0
  for i = 8, 1, -1 do n = n * 256 + bytes:byte(i) end
  local header, base = bytes:sub(9, 8 + n), 8 + n
  local t = {}
  for name, dtype, shape, a, b in header:gmatch(
      '"([^"]+)":{"dtype":"([%w_]+)","shape":%[([%d,]*)%],"data_offsets":%[(%d+),(%d+)%]}') do
    local e = { dtype = dtype, shape = shape }
    if dtype == "F32" then
      local count = (b - a) / 4
      local buf = ffi.new("float[?]", count)
      ffi.copy(buf, bytes:sub(base + a + 1, base + b), b - a)
      e.values = {}
      for i = 0, count - 1 do e.values[i + 1] = buf[i] end
    end
    t[name] = e
  end
  assert(header:find('"format":"lutra.checkpoint"', 1, true), "not a lutra checkpoint")
  return t
end

-- the names a quantizer's state takes: <prefix>fp8.<q>.scale, .scale_inv, .amax_history
local function fp8(want, prefix, quantizers)
  for _, q in ipairs(quantizers) do
    want[prefix .. "fp8." .. q .. ".scale"] = "1"
    want[prefix .. "fp8." .. q .. ".scale_inv"] = "1"
    want[prefix .. "fp8." .. q .. ".amax_history"] = tostring(HIST)
  end
  return want
end
local ROLES = { "input", "weight", "grad_output" }

local recipe = lutra.recipe.delayed { amax_history_len = HIST }

-- one FP8 training step (so that every quantizer exists and holds state)
local function step(m, x, forward)
  local scope = lutra.autocast { recipe = recipe }
  scope:enter()
  local y = forward and forward(m, x) or m:forward(x)
  m:backward(y, false)
  scope:exit()
end

local function names_of(t)
  local got = {}
  for name, e in pairs(t) do got[name] = e.shape end
  return got
end

local function saved(model)
  local path = os.tmpname()
  lutra.save(path, { model = model })
  return path
end

-- the file loads into a fresh model (quantizers built for the recipe by the load), which then
-- saves the same bytes
local function round_trip(path, make)
  local fresh = make()
  lutra.load(path, { model = fresh, recipe = recipe })
  local again = saved(fresh)
  local same = read(path) == read(again)
  os.remove(again)
  return same
end

local function input(rows, cols)
  local x = lutra.tensor({ rows, cols })
  x:randn()
  return x
end

local cases = {
  {
    what = "pre-norm block: Residual(LayerNormMLP RMSNorm swiglu), RMSNorm, Linear",
    make = function()
      return nn.Sequential(nn.Residual(nn.LayerNormMLP(H, F, { normalization = "RMSNorm",
                                                               activation = "swiglu" })),
                           nn.RMSNorm(H), nn.Linear(H, H))
    end,
    want = function()
      -- the Residual adds no level; the LayerNormMLP names its pieces norm, fc1, fc2
      local w = { ["0.norm.weight"] = "32", ["0.fc1.weight"] = "64,32", ["0.fc1.bias"] = "64",
                  ["0.fc2.weight"] = "32,32", ["0.fc2.bias"] = "32", ["1.weight"] = "32",
                  ["2.weight"] = "32,32", ["2.bias"] = "32" }
      fp8(w, "0.", { "fc1.input", "fc1.weight", "fc1.grad_output", "fc2.input", "fc2.weight",
                     "fc2.grad_output" })
      return fp8(w, "2.", ROLES)
    end,
  },
  {
    what = "LayerNormMLP with LayerNorm and GELU, as the model itself",
    make = function() return nn.LayerNormMLP(H, F) end,
    want = function()
      local w = { ["norm.weight"] = "32", ["norm.bias"] = "32", ["fc1.weight"] = "32,32",
                  ["fc1.bias"] = "32", ["fc2.weight"] = "32,32", ["fc2.bias"] = "32" }
      return fp8(w, "", { "fc1.input", "fc1.weight", "fc1.grad_output", "fc2.input",
                          "fc2.weight", "fc2.grad_output" })
    end,
  },
  {
    what = "LayerNormLinear (LayerNorm) in a Sequential with an activation",
    make = function() return nn.Sequential(nn.LayerNormLinear(H, 64), nn.GELU(), nn.Linear(64, H)) end,
    want = function()
      local w = { ["0.norm.weight"] = "32", ["0.norm.bias"] = "32", ["0.weight"] = "64,32",
                  ["0.bias"] = "64", ["2.weight"] = "32,64", ["2.bias"] = "32" }
      fp8(w, "0.", ROLES)
      return fp8(w, "2.", ROLES) -- the GELU (1) has no state and no names
    end,
  },
  {
    what = "LayerNormLinear (RMSNorm, no bias)",
    make = function() return nn.LayerNormLinear(H, H, { normalization = "RMSNorm", bias = false }) end,
    want = function() return fp8({ ["norm.weight"] = "32", weight = "32,32" }, "", ROLES) end,
  },
  {
    what = "LayerNorm and RMSNorm",
    make = function() return nn.Sequential(nn.LayerNorm(H), nn.RMSNorm(H)) end,
    want = function() return { ["0.weight"] = "32", ["0.bias"] = "32", ["1.weight"] = "32" } end,
  },
  {
    what = "GroupedLinear of 3 experts",
    make = function() return nn.GroupedLinear(3, H, 48) end,
    forward = function(m, x) return m:forward(x, { 8, 16, 8 }) end,
    want = function()
      local w = {}
      for e = 0, 2 do
        w["weight" .. e], w["bias" .. e] = "48,32", "48"
        fp8(w, "", { "input" .. e, "weight" .. e, "grad_output" .. e })
      end
      return w
    end,
  },
  {
    -- the router Linear stays high precision under autocast: no quantizer state of its own
    what = "MoEMLP of 3 experts, top 2",
    make = function() return nn.MoEMLP(H, F, 3, 2) end,
    want = function()
      local w = { ["norm.weight"] = "32", ["norm.bias"] = "32", ["router.weight"] = "3,32" }
      for e = 0, 2 do
        w["fc1.weight" .. e], w["fc1.bias" .. e] = F .. ",32", tostring(F)
        w["fc2.weight" .. e], w["fc2.bias" .. e] = "32," .. F, "32"
        for _, fc in ipairs { "fc1.", "fc2." } do
          fp8(w, fc, { "input" .. e, "weight" .. e, "grad_output" .. e })
        end
      end
      return w
    end,
  },
}

describe("checkpoint names per module kind", function()
  for _, c in ipairs(cases) do
    it(c.what .. ": the documented names and shapes, and a fresh model loads them", function()
      lutra.manual_seed(7)
      local m = c.make()
      step(m, input(ROWS, H), c.forward)
      local path = saved(m)
      local got = names_of(contents(path))
      assert.are.same(c.want(), got)
      assert.is_true(round_trip(path, c.make), "a fresh model loaded the file and saved other bytes")
      os.remove(path)
    end)
  end

  it("a GroupedLinear's file holds each expert's own amax history", function()
    lutra.manual_seed(8)
    local g = nn.GroupedLinear(3, H, H)
    local splits = { 8, 16, 8 }
    -- expert e's rows scaled by 4^e: three different amaxes
    local x = input(ROWS, H)
    local v = x:to_table()
    local amax, row = { 0, 0, 0 }, 0
    for e = 1, 3 do
      for _ = 1, splits[e] do
        for c = 1, H do
          local i = row * H + c
          v[i] = v[i] * 4 ^ (e - 1)
          amax[e] = math.max(amax[e], math.abs(v[i]))
        end
        row = row + 1
      end
    end
    x:set(v)
    step(g, x, function(m, t) return m:forward(t, splits) end)
    local path = saved(g)
    local t = contents(path)
    os.remove(path)
    for e = 1, 3 do
      local h = t["fp8.input" .. (e - 1) .. ".amax_history"].values
      local found = false
      for _, a in ipairs(h) do found = found or a == ffi.new("float", amax[e]) end
      assert.is_true(found, string.format("expert %d's history %s lacks its amax %.9g", e - 1,
                                          table.concat(h, ","), amax[e]))
    end
  end)

  it("a refused load leaves fresh models without the FP8 state it built for them", function()
    lutra.manual_seed(10)
    for _, c in ipairs { cases[1], cases[2], cases[6] } do
      local m = c.make()
      step(m, input(ROWS, H), c.forward)
      local path = saved(m)
      -- the same kind in a Sequential of another name: every name differs, the load is refused
      -- after the fresh quantizers (or a GroupedLinear's scaling state) were built
      local fresh = nn.Sequential(nn.GELU(), c.make())
      local ok, err = pcall(lutra.load, path, { model = fresh, recipe = recipe })
      assert.is_false(ok)
      assert.matches("which the objects do not have", tostring(err), 1, true)
      local again = saved(fresh)
      for name in pairs(names_of(contents(again))) do
        assert.is_nil(name:find("fp8", 1, true), c.what .. ": " .. name .. " was adopted")
      end
      os.remove(path)
      os.remove(again)
    end
  end)

  it("a MoE router checkpoints as its Linear", function()
    lutra.manual_seed(9)
    local router = lutra.moe.Router(H, 16, 2)
    step(router.linear, input(ROWS, H))
    local path = os.tmpname()
    lutra.save(path, { model = router })
    assert.are.same(fp8({ weight = "16,32" }, "", ROLES), names_of(contents(path)))
    local other = lutra.moe.Router(H, 16, 2, { seed = 99 })
    lutra.load(path, { model = other, recipe = recipe })
    os.remove(path)
    assert.is_true(router.linear:parameters()[1].value:bytes()
                   == other.linear:parameters()[1].value:bytes())
  end)
end)

describe("checkpoints refuse a module kind without a checkpoint entry", function()
  local so = os.tmpname() .. ".so"
  assert.are.equal(0, os.execute("cc -shared -fPIC -O1 -Isrc -o " .. so
                                 .. " spec/support/unsupported_module.c"))
  local stub = ffi.load(so)
  ffi.cdef("int unsupported_module_relabel(lutra_module *m);")
  os.remove(so) -- stays mapped while stub is referenced

  it("save and load fail naming the module and its kind, and write nothing", function()
    local odd = nn.Linear(H, H)
    stub.unsupported_module_relabel(odd)
    local net = nn.Sequential(nn.Linear(H, H), nn.GELU(), odd)
    local path = os.tmpname()
    os.remove(path)
    local ok, err = pcall(lutra.save, path, { model = net })
    assert.is_false(ok)
    assert.matches("lutra_checkpoint_save: module '2' is a spec_unsupported_kind, a module kind "
                   .. "that does not support checkpoints", err, 1, true)
    assert.is_nil(io.open(path, "rb"), "a file was written")
    -- as the model itself, and on load
    ok, err = pcall(lutra.save, path, { model = odd })
    assert.is_false(ok)
    assert.matches("module '(root)' is a spec_unsupported_kind", err, 1, true)
    local good = nn.Sequential(nn.Linear(H, H), nn.GELU(), nn.Linear(H, H))
    lutra.save(path, { model = good })
    ok, err = pcall(lutra.load, path, { model = net })
    os.remove(path)
    assert.is_false(ok)
    assert.matches("lutra_checkpoint_load: module '2' is a spec_unsupported_kind", err, 1, true)
    net:destroy()
    odd:destroy()
    assert.is_not_nil(stub)
  end)
end)

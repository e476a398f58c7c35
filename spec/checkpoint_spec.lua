-- Checkpoint files: what is in them (names from the module tree, the metadata), round trips, and
-- every refusal: truncated, corrupt, wrong shape, wrong dtype, names missing or extra, bad
-- arguments. A refused load must change nothing: each case snapshots the whole target state
-- (a checkpoint of it) before and after and compares the bytes, with the bad tensor sorted
-- last where that matters, so that a load writing as it checks would be caught. Saves are
-- atomic: a process killed (SIGXFSZ) or refused (EFBIG) half-way through leaves the old file.
local lutra = require("lutra")
local nn = lutra.nn
local LUAJIT = os.getenv("LUAJIT") or "luajit"

local st = require("spec.support.st_edit")
local read, write, le64, split, join = st.read, st.write, st.le64, st.split, st.join

local dir = os.tmpname()
os.remove(dir)
os.execute("mkdir -p " .. dir)
local function path(name) return dir .. "/" .. name end

local mlp, trained = st.mlp, st.trained

local recipe = lutra.recipe.delayed { amax_history_len = 4 }

local function snapshot(net, opt)
  local p = path("snapshot.st")
  lutra.save(p, { model = net, optim = opt, rng = true })
  return read(p)
end

-- a load of file into a fresh, differently seeded model must fail with msg and change nothing
local function refused(file, msg, objects_of, opts)
  local net, opt = trained(99)
  local before = snapshot(net, opt)
  local objects = objects_of and objects_of(net, opt) or { model = net, optim = opt, rng = true }
  local ok, err = pcall(lutra.load, file, objects, opts)
  assert.is_false(ok)
  assert.matches(msg, tostring(err), 1, true)
  assert.is_true(snapshot(net, opt) == before, "a refused load changed the objects")
  return err
end

describe("checkpoints", function()
  local good = path("good.st")
  local net0, opt0 = trained(1)
  lutra.save(good, { model = net0, optim = opt0, rng = true })
  local header, data = split(read(good))

  it("name the module tree and carry the format version", function()
    for _, name in ipairs { "0.weight", "0.bias", "2.weight", "2.bias", "0.fp8.input.scale",
                            "0.fp8.weight.scale_inv", "2.fp8.grad_output.amax_history",
                            "optim.0.weight.exp_avg", "optim.2.bias.exp_avg_sq", "optim.step",
                            "optim.device_step", "rng.state" } do
      assert.truthy(header:find('"' .. name .. '":{', 1, true), name)
    end
    assert.truthy(header:find('"format":"lutra.checkpoint"', 1, true))
    assert.truthy(header:find('"version":"1"', 1, true))
    assert.is_nil(header:find("main_grad", 1, true))
    assert.are.equal(0, #header % 8) -- padded: the data starts 8-byte aligned
  end)

  it("round-trip every part into freshly built objects", function()
    local net, opt = trained(2)
    assert.is_false(snapshot(net, opt) == snapshot(net0, opt0))
    lutra.load(good, { model = net, optim = opt, rng = true })
    assert.is_true(snapshot(net, opt) == snapshot(net0, opt0))
  end)

  it("build a fresh model's quantizers for the recipe given, then load their state", function()
    lutra.manual_seed(5)
    local first = nn.Linear(32, 64)
    local net = nn.Sequential(first, nn.GELU(), nn.Linear(64, 16))
    -- no FP8 forward ran: it has no quantizers yet
    assert.is_nil(first:quantizer("input"))
    local ok, err = pcall(lutra.load, good, { model = net })
    assert.is_false(ok) -- the file's FP8 state has nowhere to go
    assert.matches("holds tensor '0.fp8.grad_output.amax_history', which the objects do not have",
                   err, 1, true)
    -- a load that fails after building them for the recipe (the file lacks their state)
    -- leaves the module without them
    local nofp8 = path("nofp8.st")
    lutra.save(nofp8, { model = net0, fp8 = false })
    ok, err = pcall(lutra.load, nofp8, { model = net, recipe = recipe })
    assert.is_false(ok)
    assert.matches("lacks tensor '0.fp8.", err, 1, true)
    assert.is_nil(first:quantizer("input"))
    lutra.load(good, { model = net, recipe = recipe })
    assert.is_not_nil(first:quantizer("input"))
    local p, p0 = path("rt.st"), path("rt0.st")
    lutra.save(p, { model = net })
    lutra.save(p0, { model = net0 })
    assert.is_true(read(p) == read(p0))
    -- quantizers built for another recipe are not rebuilt under them
    local ok2, err2 = pcall(lutra.load, good, { model = net, recipe = lutra.recipe.current {} })
    assert.is_false(ok2)
    assert.matches("built for another recipe", err2, 1, true)
  end)

  it("load a model alone from a full checkpoint (the other parts skipped)", function()
    lutra.manual_seed(6)
    local net = mlp()
    lutra.load(good, { model = net, fp8 = false })
    local a, b = net:parameters(), net0:parameters()
    for i = 1, #a do assert.is_true(a[i].value:bytes() == b[i].value:bytes()) end
  end)

  it("save and load main grads when asked", function()
    lutra.manual_seed(8)
    local net = mlp { accumulate_main_grad = true }
    local x, t = lutra.tensor { 8, 32 }, lutra.tensor { 8, 16 }
    x:randn()
    t:randn()
    local loss = nn.MSELoss()
    loss:forward(net:forward(x), t)
    net:backward(loss:backward())
    local p = path("mg.st")
    lutra.save(p, { model = net, main_grads = true })
    assert.truthy(split(read(p)):find('"0.weight.main_grad"', 1, true))
    lutra.manual_seed(9)
    local net2 = mlp { accumulate_main_grad = true }
    lutra.load(p, { model = net2, main_grads = true })
    local a, b = net:parameters(), net2:parameters()
    for i = 1, #a do
      assert.is_true(a[i].main_grad:bytes() == b[i].main_grad:bytes())
      assert.is_true(a[i].value:bytes() == b[i].value:bytes())
    end
  end)

  it("name an optimizer's state by the model's tree, or by its own module's alone", function()
    lutra.manual_seed(12)
    local head = nn.Linear(64, 16, { dtype = "bf16" })
    local net = nn.Sequential(nn.Linear(32, 64, { dtype = "bf16" }), nn.GELU(), head)
    local opt = lutra.optim.AdamW(head) -- only the last layer trains
    local p = path("head.st")
    lutra.save(p, { model = net, optim = opt })
    local h = split(read(p))
    assert.truthy(h:find('"optim.2.weight.master"', 1, true))
    assert.is_nil(h:find('"optim.0.weight', 1, true))
    lutra.save(p, { optim = opt })
    h = split(read(p))
    assert.truthy(h:find('"optim.weight.exp_avg"', 1, true))
    assert.is_nil(h:find('"weight":', 1, true)) -- no parameters without a model
    -- an optimizer of a module outside the model is refused
    local ok, err = pcall(lutra.save, p, { model = nn.Linear(4, 4), optim = opt })
    assert.is_false(ok)
    assert.matches("is not in the model", err, 1, true)
  end)

  it("refresh an optimizer's masters from parameters loaded without it", function()
    lutra.manual_seed(13)
    local src = mlp { dtype = "bf16" }
    local p = path("bfmodel.st")
    lutra.save(p, { model = src })
    lutra.manual_seed(14)
    local net = mlp { dtype = "bf16" }
    local opt = lutra.optim.SGD(net, { lr = 0 }) -- lr 0: a step only rounds the masters back
    lutra.load(p, { model = net })
    local x, t = lutra.tensor({ 4, 32 }, "bf16"), lutra.tensor({ 4, 16 }, "bf16")
    local loss = nn.MSELoss()
    loss:forward(net:forward(x), t)
    net:backward(loss:backward())
    opt:step()
    local a, b = net:parameters(), src:parameters()
    for i = 1, #a do assert.is_true(a[i].value:bytes() == b[i].value:bytes()) end
  end)

  it("refuse truncated files, whatever the cut", function()
    local bytes = read(good)
    for _, cut in ipairs { 0, 5, 8, 8 + 10, 8 + #header - 1, #bytes - #data + 4, #bytes - 1 } do
      local p = path("cut.st")
      write(p, bytes:sub(1, cut))
      local err = refused(p, "lutra_checkpoint_load: ")
      assert.truthy(err:find("truncated", 1, true) or err:find("corrupt", 1, true), err)
    end
  end)

  it("refuse corrupt headers", function()
    local cases = {
      { header:gsub("^{", "[", 1), "must be a JSON object" },
      { header:gsub('"dtype"', '"dtipe"', 1), "unknown or repeated field" },
      { header:gsub('"F32"', '"F33"', 1), "unknown dtype" },
      { header:gsub('"0%.bias"', '"0.weight"', 1), "twice" },
      { header:gsub("%]}", "],}", 1), "a string was expected" },
      { header:gsub('"shape":%[', '"shape":[-', 1), "non-negative integer" },
      { header:gsub('"shape":%[', '"shape":[01,', 1), "leading zero" },
      { header:gsub("}%s*$", "}x"), "bytes follow the header" },
      { header:gsub('"data_offsets":%[0,', '"data_offsets":[4,', 1), "do not hold" },
      { header:gsub('"version":"1"', '"version":"2"', 1), "format version '2'; this lutra reads" },
    }
    for i, c in ipairs(cases) do
      local p = path("bad" .. i .. ".st")
      write(p, join(c[1], data))
      refused(p, c[2])
    end
    -- a header length beyond the format's limit, and one beyond the file
    write(path("huge.st"), le64(2 ^ 40) .. header .. data)
    refused(path("huge.st"), "exceeds the format's")
    write(path("long.st"), le64(#header + #data + 1) .. header .. data)
    refused(path("long.st"), "truncated")
  end)

  it("refuse a tensor of the wrong shape, before writing any other", function()
    lutra.manual_seed(3)
    local other = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8))
    local p = path("shape.st")
    lutra.save(p, { model = other })
    -- "2.weight" sorts after "0.*", which a load writing as it checks would already have written
    refused(p, "tensor '2.bias' has shape [8], '2.bias' in the objects is [16]",
            function(net) return { model = net, fp8 = false } end)
  end)

  it("refuse a tensor of the wrong dtype unless conversion is asked for", function()
    lutra.manual_seed(4)
    local bf = mlp { dtype = "bf16" }
    local p = path("bf16.st")
    lutra.save(p, { model = bf })
    refused(p, "has dtype BF16, '0.bias' in the objects is F32 (convert = true converts)",
            function(net) return { model = net, fp8 = false } end)
    -- with convert: bf16 widens to f32 exactly
    local net = mlp()
    lutra.load(p, { model = net, fp8 = false }, { convert = true })
    local a, b = net:parameters(), bf:parameters()
    for i = 1, #a do assert.are.same(b[i].value:to_table(), a[i].value:to_table()) end
  end)

  it("refuse missing and extra names", function()
    lutra.manual_seed(5)
    local p = path("short.st")
    lutra.save(p, { model = nn.Sequential(nn.Linear(32, 64), nn.GELU()) })
    refused(p, "lacks tensor '2.bias'", function(net) return { model = net, fp8 = false } end)
    local p2 = path("long2.st")
    lutra.save(p2, { model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 16),
                                           nn.GELU(), nn.Linear(16, 16)) })
    refused(p2, "holds tensor '4.bias', which the objects do not have",
            function(net) return { model = net, fp8 = false } end)
    -- an optimizer of another kind
    refused(good, "holds adamw optimizer state; the optimizer given is sgd", function(net)
      return { model = net, optim = lutra.optim.SGD(net, { momentum = 0.9 }) }
    end)
    -- a file without optimizer state, asked for one
    local p3 = path("noopt.st")
    lutra.save(p3, { model = net0 })
    refused(p3, "holds no optimizer state")
  end)

  it("refuse bad arguments", function()
    local net = mlp()
    local cases = {
      { function() lutra.load(nil, { model = net }) end, "path must be a non-empty string" },
      { function() lutra.load("", { model = net }) end, "path must be a non-empty string" },
      { function() lutra.save(good, net) end, "objects must be a table" },
      { function() lutra.save(good, { modle = net }) end, "unknown option 'modle'" },
      { function() lutra.save(good, { model = 3 }) end, "model must be a module or nil" },
      { function() lutra.save(good, { model = { checkpoint_module = function() return 3 end } }) end,
        "model must be a module or nil" },
      { function() lutra.save(good, { model = net, rng = 1 }) end, "rng must be a boolean" },
      { function() lutra.save(good, {}) end, "the objects name nothing" },
      { function() lutra.save(good, { model = net, recipe = recipe }) end, "recipe is for lutra.load" },
      { function() lutra.load(path("absent.st"), { model = net }) end, "cannot open" },
      { function() lutra.load(good, { model = net }, { map = { x = 1 } }) end, "map entries" },
      { function() lutra.load(good, { model = net }, { map = { nope = "0.weight" } }) end,
        "map renames 'nope', which" },
      { function() lutra.save(dir .. "/no/such/dir/x.st", { model = net }) end, "cannot create" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(c[1])
      assert.is_false(ok)
      assert.matches(c[2], tostring(err), 1, true)
    end
    -- C: NULL path and objects
    local o = lutra.ffi.new("lutra_checkpoint_objects")
    assert.are_not.equal(0, lutra.C.lutra_checkpoint_save(nil, o))
    assert.matches("path is NULL", lutra.ffi.string(lutra.C.lutra_last_error()), 1, true)
    assert.are_not.equal(0, lutra.C.lutra_checkpoint_load(good, nil, nil))
    assert.matches("objects is NULL", lutra.ffi.string(lutra.C.lutra_last_error()), 1, true)
    assert.are_not.equal(0, lutra.C.lutra_seed_state(nil))
  end)

  it("refuse to save or load inside an autocast scope", function()
    local scope = lutra.autocast { recipe = recipe }
    scope:enter()
    local ok, err = pcall(lutra.save, good, { model = net0 })
    local ok2, err2 = pcall(lutra.load, good, { model = net0 })
    scope:exit()
    assert.is_false(ok)
    assert.is_false(ok2)
    assert.matches("inside an autocast scope", err, 1, true)
    assert.matches("inside an autocast scope", err2, 1, true)
  end)

  it("leave the old file when a save is killed or refused half-way", function()
    local target = path("crash.st")
    write(target, "the old checkpoint")
    local function run(trap)
      -- 256 blocks of 512 bytes (POSIX sh) is far below the 2 MB the save writes
      local cmd = string.format("cd %s && sh -c \"%s ulimit -f 256; exec %s %s %s\" 2>&1",
                                ".", trap, LUAJIT, "spec/support/crash_save.lua", target)
      local p = assert(io.popen(cmd))
      local out = p:read("*a")
      p:close()
      return out
    end
    local killed = run("")
    assert.is_nil(killed:find("saved", 1, true))
    assert.are.equal("the old checkpoint", read(target))
    local refused_out = run("trap '' XFSZ;")
    assert.matches("failed: lutra_checkpoint_save: cannot write", refused_out, 1, true)
    assert.are.equal("the old checkpoint", read(target))
    -- the refused save removed its temporary file, and the one the killed save left (its
    -- process is gone; spec/checkpoint_bad_input_spec.lua has the kill -9 cases)
    local p = assert(io.popen("ls -a " .. dir .. " | grep -c '^.crash.st.tmp' || true"))
    local temps = tonumber(p:read("*a"))
    p:close()
    assert.are.equal(0, temps)
    -- a save that completes replaces the file
    local ok = run("")
    assert.is_nil(ok:find("saved", 1, true)) -- still limited
    local p2 = assert(io.popen(LUAJIT .. " spec/support/crash_save.lua " .. target))
    assert.matches("saved", p2:read("*a"), 1, true)
    p2:close()
    assert.are.equal("{", split(read(target)):sub(1, 1))
  end)

  teardown(function() os.execute("rm -rf " .. dir) end)
end)

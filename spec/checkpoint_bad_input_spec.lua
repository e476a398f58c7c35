-- Bad input for the checkpoint format (issue 40): a good file cut at many offsets, its header's
-- bytes flipped one at a time, known entries given wrong dtypes and shapes, non-finite or
-- malformed metadata, huge or lying header lengths, a 2 GiB bogus file, and a save killed with
-- SIGKILL half-way. Every case: an error naming the C call (lutra_checkpoint_load) and the file
-- and reason, no crash, and the target objects as they were (a checkpoint of them before and
-- after, compared byte for byte). The target starts from the good file's own state, so a flip
-- that changes nothing the file means (a hex digit's case, say) may load: it must then leave the
-- same state.
local ffi = require("ffi")
local lutra = require("lutra")
local st = require("spec.support.st_edit")
local LUAJIT = os.getenv("LUAJIT") or "luajit"

local dir = st.tempdir(true)
local function path(name) return dir .. "/" .. name end

local recipe = lutra.recipe.delayed { amax_history_len = 4 }
local model = st.mlp
-- a model trained 2 steps (delayed scaling, AdamW, the generator): every part of the format
-- has state
local src_net, src_opt = st.trained(5)
local good = path("good.st")
lutra.save(good, { model = src_net, optim = src_opt, rng = true })
local bytes = st.read(good)
local header, data = st.split(bytes)

-- the target: fresh objects loaded from the good file
local net = model()
local opt = lutra.optim.AdamW(net, { lr = 1e-3 })
local objects = { model = net, optim = opt, rng = true, recipe = recipe }
lutra.load(good, objects)
local snapshot = path("snapshot.st")
local function state()
  lutra.save(snapshot, { model = net, optim = opt, rng = true })
  return st.read(snapshot)
end
local reference = state()

-- loads bytes; returns the error (nil if it loaded) after checking the state is the reference
local function try(b, what)
  local bad = path("bad.st")
  st.write(bad, b)
  local ok, err = pcall(lutra.load, bad, objects)
  assert.are.equal(reference, state(), "the state changed: " .. what)
  if ok then return nil end
  assert.matches("^lutra_checkpoint_load: ", err)
  assert.matches(bad, err, 1, true)
  return err
end

local function refused(b, what, reason)
  local err = try(b, what)
  assert.is_not_nil(err, "loaded: " .. what)
  if reason then assert.matches(reason, err, 1, true) end
  return err
end

describe("checkpoint bad input", function()
  it("refuses the file cut at every offset of its header and many of its data", function()
    local offsets = {}
    for n = 0, 8 + #header do offsets[#offsets + 1] = n end
    for k = 1, 64 do offsets[#offsets + 1] = 8 + #header + math.floor(#data * k / 65) end
    offsets[#offsets + 1] = #bytes - 1
    for _, n in ipairs(offsets) do
      local err = refused(bytes:sub(1, n), "cut at " .. n)
      assert.is_truthy(err:find("truncated", 1, true) or err:find("corrupt safetensors", 1, true),
                       "cut at " .. n .. ": " .. err)
    end
  end)

  it("refuses, or reads the same, with any header byte flipped", function()
    -- the optimizer's numbers: a different digit is a different valid value (an lr, a step
    -- count, a threshold): no header checksum catches it
    local numbers = {}
    for _, key in ipairs { "optim.lr", "optim.warmup_steps", "optim.total_steps", "optim.min_lr",
                           "optim.max_grad_norm" } do
      local b, e = header:find('"' .. key:gsub("%p", "%%%0") .. '":"[^"]*"')
      assert.is_not_nil(b, key)
      numbers[#numbers + 1] = { b, e }
    end
    local function in_number(i)
      for _, r in ipairs(numbers) do
        if i >= r[1] and i <= r[2] then return true end
      end
      return false
    end
    local loaded = 0
    for i = 1, #header do
      for _, mask in ipairs { 0x01, 0x20, 0x80 } do
        if not (mask == 0x01 and in_number(i)) then
          local h = header:sub(1, i - 1) .. string.char(bit.bxor(header:byte(i), mask)) ..
                    header:sub(i + 1)
          if not try(st.join(h, data), string.format("byte %d ^ 0x%02x", i, mask)) then
            loaded = loaded + 1
          end
        end
      end
    end
    -- what loads is the rare flip that means the same (the case of a hex digit or of "x", "p")
    assert.is_true(loaded < #header / 20, loaded .. " flips loaded")
  end)

  it("refuses wrong dtypes and shapes for known entries", function()
    local function retyped(name, from, to)
      local quoted = '"' .. name:gsub("%p", "%%%0") .. '":{'
      local h, n = header:gsub(quoted .. from:gsub("%p", "%%%0"),
                               '"' .. name .. '":{' .. to:gsub("%%", "%%%%"), 1)
      assert.are.equal(1, n, name .. " " .. from)
      return st.join(h, data)
    end
    local cases = {
      { "0.weight", '"dtype":"F32","shape":[64,32]', '"dtype":"I32","shape":[64,32]', "has dtype I32" },
      { "0.weight", '"dtype":"F32","shape":[64,32]', '"dtype":"U32","shape":[64,32]', "has dtype U32" },
      { "0.weight", '"dtype":"F32","shape":[64,32]', '"dtype":"F32","shape":[32,64]', "has shape [32, 64]" },
      { "0.weight", '"dtype":"F32","shape":[64,32]', '"dtype":"F32","shape":[2048]', "has shape [2048]" },
      { "0.weight", '"dtype":"F32","shape":[64,32]', '"dtype":"F8_E4M3","shape":[64,128]', "has shape [64, 128]" },
      { "0.fp8.input.scale", '"dtype":"F32","shape":[1]', '"dtype":"I32","shape":[1]', "has dtype I32" },
      { "0.fp8.input.scale", '"dtype":"F32","shape":[1]', '"dtype":"F32","shape":[1,1]', "has shape [1, 1]" },
      { "0.fp8.input.amax_history", '"dtype":"F32","shape":[4]', '"dtype":"F32","shape":[2,2]', "has shape [2, 2]" },
      { "0.fp8.input.amax_history", '"dtype":"F32","shape":[4]', '"dtype":"F16","shape":[8]', "has shape [8]" },
      { "0.fp8.input.amax_history", '"dtype":"F32","shape":[4]', '"dtype":"I32","shape":[4]', "has dtype I32" },
      { "optim.step", '"dtype":"I64"', '"dtype":"U64"', "has dtype U64" },
      { "optim.step", '"dtype":"I64"', '"dtype":"F64"', "has dtype F64" },
      { "optim.device_step", '"dtype":"I64","shape":[1]', '"dtype":"I32","shape":[2]', "has shape [2]" },
      { "rng.state", '"dtype":"U64"', '"dtype":"I64"', "has dtype I64" },
      { "optim.0.weight.exp_avg", '"dtype":"F32","shape":[64,32]', '"dtype":"BF16","shape":[64,64]', "has shape [64, 64]" },
      { "optim.0.weight.exp_avg", '"dtype":"F32","shape":[64,32]', '"dtype":"I32","shape":[64,32]', "has dtype I32" },
      { "0.bias", '"dtype":"F32"', '"dtype":"F99"', "unknown dtype" },
    }
    for _, c in ipairs(cases) do
      refused(retyped(c[1], c[2], c[3]), c[1] .. " " .. c[3], c[4])
    end
    -- convert = true converts parameters between float dtypes only, never state
    local ok, err = pcall(lutra.load, good, objects, { convert = true })
    assert.is_true(ok, err)
    st.write(path("conv.st"), retyped("0.fp8.input.amax_history", '"dtype":"F32","shape":[4]',
                                      '"dtype":"I32","shape":[4]'))
    ok, err = pcall(lutra.load, path("conv.st"), objects, { convert = true })
    assert.is_false(ok)
    assert.matches("has dtype I32", err, 1, true)
    assert.are.equal(reference, state())
  end)

  it("refuses non-finite and malformed metadata", function()
    for _, c in ipairs {
      { "optim.lr", "inf" }, { "optim.lr", "nan" }, { "optim.lr", "-1" }, { "optim.lr", "1e39" },
      { "optim.lr", "0x1p+128" }, { "optim.lr", "" }, { "optim.lr", "0x1,47ae14p-7" },
      { "version", "nan" }, { "version", "inf" }, { "version", "1e0" }, { "version", "" },
      { "data.crc32c", "nan" }, { "data.crc32c", "FFFFFFFF" }, { "optim.kind", "sgd" },
      { "optim.kind", "" }, { "optim.schedule", "step" }, { "optim.warmup_steps", "-1" },
      { "optim.total_steps", "1e3" }, { "optim.min_lr", "nan" }, { "optim.min_lr", "-1" },
      { "optim.max_grad_norm", "-1" }, { "optim.max_grad_norm", "nan" },
    } do
      refused(st.join(st.set_meta(header, c[1], c[2]), data), c[1] .. " = " .. c[2], c[1] == "version"
              and "format version" or c[1] == "optim.kind" and "optimizer state" or c[1])
    end
    -- non-finite data where the format has meaning: an FP8 scale (with the checksum dropped, so
    -- the value check is what refuses it)
    local plain = header:gsub('"data.crc32c":"%x+",', "", 1)
    for _, v in ipairs { 0 / 0, math.huge, 0 } do
      refused(st.join(plain, st.patch(plain, data, "2.fp8.weight.scale", st.f32(v))),
              "scale " .. tostring(v), "an FP8 scale must be finite and positive")
    end
  end)

  it("refuses huge and lying header lengths", function()
    local body = bytes:sub(9)
    for _, n in ipairs { 2 ^ 63, 2 ^ 40, 100000001, #body + 1, #body + 4096 } do
      local err = refused(st.le64(n) .. body, "header length " .. n)
      assert.is_truthy(err:find("exceeds the format", 1, true) or err:find("truncated", 1, true),
                       err)
    end
    for _, n in ipairs { 0, 1, 2, #header:match("^(.-)%s*$") - 1 } do
      refused(st.le64(n) .. body, "header length " .. n, "corrupt safetensors header")
    end
    -- one byte short cuts a padding space: the header parses, the data is a byte too long
    refused(st.le64(#header - 1) .. body, "header length one short", "longer than its header")
  end)

  it("refuses a 2 GiB bogus file after reading its header only", function()
    ffi.cdef [[
      struct lutra_spec_rusage { long t[4]; long maxrss; long rest[13]; };
      int getrusage(int who, struct lutra_spec_rusage *usage);
    ]]
    local ru = ffi.new("struct lutra_spec_rusage")
    local function rss_kib()
      ffi.C.getrusage(0, ru)
      return tonumber(ru.maxrss)
    end
    local huge = path("huge.st")
    -- the good header with 2 GiB of (sparse) data after it, and a header of garbage
    st.write(huge, st.le64(#header) .. header)
    assert.are.equal(0, os.execute("truncate -s 2G " .. huge))
    local before, t0 = rss_kib(), os.clock()
    local ok, err = pcall(lutra.load, huge, objects)
    assert.is_false(ok)
    assert.matches("is longer than its header says", err, 1, true)
    st.write(huge, st.le64(1000) .. string.rep("x", 1000))
    assert.are.equal(0, os.execute("truncate -s 2G " .. huge))
    ok, err = pcall(lutra.load, huge, objects)
    assert.is_false(ok)
    assert.matches("corrupt safetensors header", err, 1, true)
    -- the old loader read it all: 2 GiB of memory and seconds
    assert.is_true(os.clock() - t0 < 1, "took " .. (os.clock() - t0) .. " s")
    assert.is_true(rss_kib() - before < 65536, "grew by " .. (rss_kib() - before) .. " KiB")
    assert.are.equal(reference, state())
    os.remove(huge)
  end)

  it("leaves no temporaries after a save killed with SIGKILL, and keeps live ones", function()
    local target = path("killed.st")
    local function temps()
      local p = assert(io.popen("ls -a " .. dir .. " | grep '^\\.killed\\.st\\.tmp\\.' || true"))
      local t = {}
      for line in p:lines() do t[#t + 1] = line end
      p:close()
      return t
    end
    -- kill a saving process until one dies inside a save (its temporary left behind)
    local left
    for _ = 1, 10 do
      -- the last try's file removed, so that the wait below is for this process's first save
      -- (a loaded machine may take longer to start it than the pause after the wait)
      os.remove(target)
      local p = assert(io.popen(string.format("%s spec/support/save_loop.lua %s & echo $!",
                                              LUAJIT, target)))
      local pid = p:read("*l")
      -- wait for the first save to finish, so the next ones are well under way
      for _ = 1, 600 do
        local f = io.open(target, "rb")
        if f then
          f:close()
          break
        end
        os.execute("sleep 0.05")
      end
      os.execute("sleep 0.2")
      os.execute("kill -9 " .. pid)
      p:close()
      -- SIGKILL is delivered asynchronously: wait until the process is dead (a zombie, or
      -- reaped), as Linux's /proc tells (not ps: under the ASan suite it would run preloaded)
      for _ = 1, 100 do
        local f = io.open("/proc/" .. pid .. "/stat", "r")
        local stat = f and f:read("*a") or ""
        if f then f:close() end
        if not f or stat:match(".*%) (%a)") == "Z" then break end
        os.execute("sleep 0.05")
      end
      left = temps()
      if #left > 0 then break end
    end
    assert.is_true(#left > 0, "no save was killed half-way in 10 tries")
    -- temporaries of a live process (a sleep started here), of this process (another thread
    -- could be saving) and names that only look alike stay
    local sleeper = assert(io.popen("sleep 60 & echo $!"))
    local live = sleeper:read("*l")
    ffi.cdef "int getpid(void);"
    local keep = { ".killed.st.tmp." .. live .. ".0", ".killed.st.tmp." .. ffi.C.getpid() .. ".7",
                   ".killed.st.tmp.x.0", "killed.st.tmp.999999.0", ".other.st.tmp.999999.0",
                   ".killed.st.tmp.999999.0.bak" }
    for _, name in ipairs(keep) do st.write(path(name), "keep") end
    st.write(path(".killed.st.tmp.999999.3"), "stale") -- no such process (above pid_max)
    lutra.save(target, { model = net })
    for _, name in ipairs(left) do assert.is_nil(io.open(path(name), "rb"), name .. " stayed") end
    assert.is_nil(io.open(path(".killed.st.tmp.999999.3"), "rb"))
    for _, name in ipairs(keep) do
      assert.are.equal("keep", st.read(path(name)), name .. " was removed")
    end
    os.execute("kill " .. live)
    sleeper:close()
    -- the target is a whole checkpoint
    local m2 = model()
    lutra.load(target, { model = m2, fp8 = false })
  end)

  teardown(function() os.execute("rm -rf " .. dir) end)
end)

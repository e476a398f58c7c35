-- The determinism switch (lutra.deterministic, lutra_set_deterministic, LUTRA_DETERMINISTIC;
-- lutra/determinism.h) on the CPU backend:
--   - a short training run (an MLP and a TransformerLayer with attention dropout, AdamW, a few
--     steps, fresh random inputs) run twice in one process from the same seed under the switch
--     ends with bitwise the same weights; from another seed with other weights (so the
--     comparison is not vacuous);
--   - the switch pins OpenBLAS to one thread (its sums depend on its thread count): a GEMM asked
--     for two threads under the switch gives the one-thread bits, lutra_cpu_set_threads(2) is
--     refused while it is on, and turning it off gives back the count asked for;
--   - the getter and setter (the previous value returned), the environment variable read at
--     load (in a fresh LuaJIT), and bad input refused without changing the setting.
local lutra = require("lutra")
local sh = require("spec.support.shell").sh
local first_difference = require("spec.support.bitwise").first_difference
local core = require("lutra.core")
local C, ffi = core.C, core.ffi
local nn = lutra.nn
local seed = os.time() % 100000

-- every parameter's bits, in order
local function weights(model)
  local out = {}
  for _, p in ipairs(model:parameters()) do
    local v = p.value:to_table()
    for i = 1, #v do out[#out + 1] = v[i] end
  end
  return out
end

-- An MLP then a TransformerLayer with attention dropout, trained with AdamW for a few steps on
-- fresh inputs; everything seeded from s through the global generator. Returns the weights.
local function train(s)
  lutra.manual_seed(s)
  local B, T, hidden = 2, 6, 16
  local model = nn.Sequential(nn.Linear(hidden, 32), nn.GELU(), nn.Linear(32, hidden),
                              nn.TransformerLayer(hidden, 32, 4, { attention_dropout = 0.2 }))
  local opt = lutra.optim.AdamW(model, { lr = 1e-2, weight_decay = 0.01 })
  local loss = nn.MSELoss()
  for step = 1, 4 do
    local x = lutra.tensor({ B, T, hidden }):randn(s + 100 * step, 0, 1)
    local target = lutra.tensor({ B, T, hidden }):randn(s + 100 * step + 1, 0, 1)
    loss:forward(model:forward(x), target)
    model:backward(loss:backward())
    opt:step()
  end
  return weights(model)
end

-- the switch and the GEMM threads of a fresh LuaJIT loading lutra with the environment env
local function at_load(env)
  local script = [[local l = require('lutra'); ]] ..
                 [[io.write(tostring(l.deterministic()), ' ', tonumber(l.C.lutra_cpu_threads()))]]
  local ok, out = sh("env -u LUTRA_DETERMINISTIC -u LUTRA_CPU_THREADS -u OPENBLAS_NUM_THREADS " ..
                     env .. " LUA_PATH='lua/?.lua;lua/?/init.lua;;' ${LUAJIT:-luajit} -e \"" ..
                     script .. "\"")
  assert(ok, out)
  local on, threads = out:match("(%a+) (%d+)$")
  return on, tonumber(threads)
end

local function env_switch(env) return (at_load(env)) end

describe("the determinism switch (cpu)", function()
  local was
  before_each(function() was = lutra.deterministic(false) end)
  after_each(function() lutra.deterministic(was) end)

  it("trains to bitwise the same weights from the same seed, and to others from another", function()
    assert.is_false(lutra.deterministic(true))
    local a, b = train(seed), train(seed)
    local c = train(seed + 1)
    local i = first_difference(a, b)
    assert.is_nil(i, i and string.format("weight %d: %.9g then %.9g", i, a[i], b[i]))
    assert.is_truthy(first_difference(a, c), "another seed trains other weights")
  end)

  it("pins OpenBLAS to one thread: a GEMM asked for two gives the one-thread bits", function()
    local before = tonumber(C.lutra_cpu_threads())
    -- a shape whose sums OpenBLAS splits by its thread count (0.3.21 differs between 1 and 2)
    local m, n, k = 128, 96, 3000
    local a = lutra.tensor({ k, n }):randn(seed + 1, 0, 1)
    local b = lutra.tensor({ m, k }):randn(seed + 2, 0, 1)
    local one, pinned = lutra.tensor({ m, n }), lutra.tensor({ m, n })
    assert.are.equal(C.LUTRA_OK, C.lutra_cpu_set_threads(1))
    lutra.gemm(a, "N", b, "N", one)
    assert.are.equal(C.LUTRA_OK, C.lutra_cpu_set_threads(2))
    lutra.deterministic(true)
    assert.are.equal(1, tonumber(C.lutra_cpu_threads()))
    lutra.gemm(a, "N", b, "N", pinned)
    local i = first_difference(one:to_table(), pinned:to_table())
    assert.is_nil(i, "element " .. tostring(i) .. " differs from the one-thread GEMM's")
    -- asking for more threads is refused while it is on, and changes nothing
    assert.are.equal(C.LUTRA_ESTATE, C.lutra_cpu_set_threads(2))
    assert.matches("lutra_cpu_set_threads: the determinism switch is on",
                   ffi.string(C.lutra_last_error()))
    assert.are.equal(1, tonumber(C.lutra_cpu_threads()))
    -- off: the count asked for before it comes back
    lutra.deterministic(false)
    local _, cores = sh("nproc")
    assert.are.equal(math.min(2, tonumber(cores:match("%d+"))), tonumber(C.lutra_cpu_threads()))
    assert.are.equal(C.LUTRA_OK, C.lutra_cpu_set_threads(before))
  end)

  it("returns the previous setting, and reads it with no argument", function()
    assert.is_false(lutra.deterministic())
    assert.is_false(lutra.deterministic(true))
    assert.is_true(lutra.deterministic())
    assert.are.equal(1, C.lutra_deterministic())
    assert.is_true(lutra.deterministic(true))
    assert.is_true(lutra.deterministic(false))
    assert.are.equal(0, C.lutra_deterministic())
  end)

  it("follows LUTRA_DETERMINISTIC at load: any value but empty or 0 turns it on", function()
    assert.are.equal("false", env_switch(""))
    assert.are.equal("true", env_switch("LUTRA_DETERMINISTIC=1"))
    assert.are.equal("true", env_switch("LUTRA_DETERMINISTIC=yes"))
    assert.are.equal("false", env_switch("LUTRA_DETERMINISTIC=0"))
    assert.are.equal("false", env_switch("LUTRA_DETERMINISTIC="))
    -- read before the GEMM threads are set at load: one thread whatever LUTRA_CPU_THREADS asks
    local _, cores = sh("nproc")
    assert.are.same({ "true", 1 }, { at_load("LUTRA_DETERMINISTIC=1 LUTRA_CPU_THREADS=2") })
    assert.are.same({ "false", math.min(2, tonumber(cores:match("%d+"))) },
                    { at_load("LUTRA_CPU_THREADS=2") })
  end)

  it("refuses bad input, changing nothing", function()
    lutra.deterministic(true)
    local ok, e = pcall(lutra.deterministic, "yes")
    assert.is_false(ok)
    assert.matches("lutra.deterministic: on must be a boolean %(got string%)", e)
    assert.is_true(lutra.deterministic())
    assert.are.equal(C.LUTRA_EINVAL, C.lutra_set_deterministic(2))
    assert.matches("lutra_set_deterministic: on must be 0 or 1, not 2",
                   ffi.string(C.lutra_last_error()))
    assert.are.equal(C.LUTRA_EINVAL, C.lutra_set_deterministic(-1))
    assert.are.equal(1, C.lutra_deterministic())
  end)
end)

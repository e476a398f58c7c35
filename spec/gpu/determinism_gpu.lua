-- The determinism switch (lutra.deterministic; lutra/determinism.h) on the device: a small
-- GPT-like model (token embedding, a TransformerLayer with attention dropout, a MoE
-- TransformerLayer of GroupedLinear experts, LayerNorm, a linear head, cross-entropy, AdamW) in
-- bf16 trained a few steps on fresh random tokens:
--   - twice from the same seed under the switch, eagerly: bitwise the same weights; from
--     another seed: other weights (so the comparison is not vacuous);
--   - captured as one CUDA graph (a warm-up step, then replays): twice the same weights, and the
--     weights of the same number of eager steps;
--   - the switch forces cuDNN's deterministic attention backward even where
--     LUTRA_CUDNN_DETERMINISTIC=0 asks for the other (module:plans() says which a plan has);
--   - turning it on or off inside a capture is refused.
local lutra = require("lutra")
local ffi = require("ffi")
local nn = lutra.nn
local S = require("spec.gpu.support")
local first_difference = require("spec.support.bitwise").first_difference
local DEV = S.DEV
local function test(name, fn) S.test(it, name, fn) end

local SEED = os.time() % 100000
local B, T, VOCAB, DIM, HEADS = 4, 64, 96, 64, 2
local STEPS = 3

local function build(seed)
  lutra.manual_seed(seed)
  local where = { dtype = "bf16", device = DEV }
  local m = {
    tok = nn.Embedding(VOCAB, DIM, where),
    dense = nn.TransformerLayer(DIM, 4 * DIM, HEADS, { attention_dropout = 0.1, dtype = "bf16",
                                                        device = DEV }),
    moe = nn.TransformerLayer(DIM, 2 * DIM, HEADS, { attention_dropout = 0.1,
                                                      moe = { experts = 4, top_k = 2 },
                                                      dtype = "bf16", device = DEV }),
    norm = nn.LayerNorm(DIM, where),
    head = nn.Linear(DIM, VOCAB, { bias = false, dtype = "bf16", device = DEV }),
    loss = nn.CrossEntropyLoss(),
  }
  m.all = nn.Sequential(m.tok, m.dense, m.moe, m.norm, m.head)
  m.opt = lutra.optim.AdamW(m.all, { lr = 1e-3, weight_decay = 0.1 })
  m.x = lutra.tensor({ B, T }, "i32", DEV)
  m.y = lutra.tensor({ B, T }, "i32", DEV)
  return S.hold(m)
end

local function step(m)
  local h = m.moe:forward(m.dense:forward(m.tok:forward(m.x)))
  m.loss:forward(m.head:forward(m.norm:forward(h)), m.y)
  local dh = m.norm:backward(m.head:backward(m.loss:backward()))
  m.tok:backward(m.dense:backward(m.moe:backward(dh)), false)
  m.opt:step()
end

local function random_ids(seed)
  math.randomseed(seed)
  local t = {}
  for i = 1, B * T do t[i] = math.random(0, VOCAB - 1) end
  return t
end

local function set_batch(m, seed, n)
  m.x:set(random_ids(seed + 2 * n))
  m.y:set(random_ids(seed + 2 * n + 1))
end

local function weights(m)
  local out = {}
  for i, p in ipairs(m.all:parameters()) do out[i] = p.value:bytes() end
  return out
end

local function train_eager(seed)
  local m = build(seed)
  for n = 1, STEPS do
    set_batch(m, seed, n)
    step(m)
  end
  return weights(m)
end

-- a warm-up step, a capture, STEPS - 1 replays: STEPS steps
local function train_graphed(seed)
  local m = build(seed)
  set_batch(m, seed, 1)
  local g = lutra.graph.capture(function() step(m) end, { warmup = 1 })
  for n = 2, STEPS do
    set_batch(m, seed, n)
    g:replay()
  end
  local w = weights(m)
  g:destroy()
  return w
end

pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);" ..
                "int unsetenv(const char *name);")

describe("the determinism switch on " .. DEV, function()
  local was
  before_each(function() was = lutra.deterministic(true) end)
  after_each(function() lutra.deterministic(was) end)

  test("trains a GPT-like model with dropout and MoE to the same bits from the same seed", function()
    local a, b = train_eager(SEED), train_eager(SEED)
    local i = first_difference(a, b)
    assert.is_nil(i, "parameter " .. tostring(i) .. " differs between two runs (seed " .. SEED .. ")")
    assert.is_truthy(first_difference(a, train_eager(SEED + 1)), "another seed trains other weights")
  end)

  test("captured and replayed: the same bits twice, and those of the eager steps", function()
    if DEV == "cpu" then return end -- CUDA graphs need cuda
    local a, b = train_graphed(SEED), train_graphed(SEED)
    local i = first_difference(a, b)
    assert.is_nil(i, "parameter " .. tostring(i) .. " differs between two graphed runs")
    i = first_difference(a, train_eager(SEED))
    assert.is_nil(i, "parameter " .. tostring(i) .. " differs from the eager run's")
  end)

  test("is refused inside a capture, changing nothing", function()
    if DEV == "cpu" then return end -- CUDA graphs need cuda
    local ok, err = pcall(lutra.graph.capture, function() lutra.deterministic(false) end,
                          { warmup = 0 })
    assert.is_false(ok)
    assert.matches("lutra_set_deterministic: inside a CUDA graph capture", err)
    assert.is_false(lutra.graph.capturing())
    assert.is_true(lutra.deterministic())
  end)

  test("forces cuDNN's deterministic attention backward over LUTRA_CUDNN_DETERMINISTIC=0", function()
    if DEV == "cpu" then return end -- the CPU's backward is deterministic always
    local old = os.getenv("LUTRA_CUDNN_DETERMINISTIC")
    ffi.C.setenv("LUTRA_CUDNN_DETERMINISTIC", "0", 1)
    local ok, err = pcall(function()
      local function plan_after_step(on)
        lutra.deterministic(on)
        local m = S.hold(nn.DotProductAttention(HEADS, 64, { dtype = "bf16", device = DEV }))
        local q = lutra.tensor({ 2, 128, HEADS, 64 }, "bf16", DEV):randn(SEED)
        m:forward(q, q, q)
        m:backward(q)
        local _, deterministic = m:plans()
        return deterministic
      end
      assert.is_true(plan_after_step(true), "the switch's plan is deterministic")
      assert.is_false(plan_after_step(false), "without the switch LUTRA_CUDNN_DETERMINISTIC=0 holds")
    end)
    if old then ffi.C.setenv("LUTRA_CUDNN_DETERMINISTIC", old, 1) else ffi.C.unsetenv("LUTRA_CUDNN_DETERMINISTIC") end
    assert(ok, err)
  end)
end)

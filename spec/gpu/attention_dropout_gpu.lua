-- nn.DotProductAttention on the device with dropout under CUDA graphs, and its shared workspace
-- (issue 41; src/nn/attention.c, src/nn/attention_workspace.c,
-- src/backend/cuda/attention_cudnn.cpp):
--   - the Philox offset lives on the device and a one-thread kernel advances it before each
--     forward, captured with it: a captured forward + backward replayed K times gives bit for bit
--     the outputs and gradients of K eager steps of a module of the same seed, each step a fresh
--     mask (consecutive steps differ: the control that the comparison can fail);
--   - the generator's state read after replays (module:rng_state, read back from the device) is
--     the eager module's, and a checkpoint saved then resumes to the same masks: a fresh module
--     loaded from it and the graph's next replay both equal the eager module's next step;
--   - a state set on the host (a load, set_rng_state) cannot be written by a capture: a capture
--     right after it is refused, naming why, and changes nothing;
--   - the workspace of cuDNN's deterministic backward is one per stream: 8 modules of one
--     shape, each run forward and backward, hold only their own outputs and gradients beyond
--     the first module's workspace (lutra.device_memory).
local lutra = require("lutra")
local nn = lutra.nn
local S = require("spec.gpu.support")
local st = require("spec.support.st_edit")
local DEV = S.DEV
local function test(name, fn) S.test(it, name, fn) end

local SEED = os.time() % 100000
local H, D, B, T, P = 2, 64, 2, 64, 0.3
local K = 4

local dir = st.tempdir()
teardown(function() os.execute("rm -rf " .. dir) end)

local function module(seed)
  return S.hold(nn.DotProductAttention(H, D, { dropout = P, seed = seed, dtype = "bf16",
                                               device = DEV }))
end

local inputs -- q, k, v, dout: the same values for every module
local function fresh_inputs()
  inputs = {}
  for i = 1, 4 do inputs[i] = lutra.tensor({ B, T, H, D }, "bf16", DEV):randn(SEED + i) end
end

-- one step's results as one string of bytes
local function bytes_of(out, dq, dk, dv)
  return out:bytes() .. dq:bytes() .. dk:bytes() .. dv:bytes()
end

local function eager_step(m)
  local out = m:forward(inputs[1], inputs[2], inputs[3])
  local dq, dk, dv = m:backward(inputs[4])
  return bytes_of(out, dq, dk, dv)
end

-- a module with one warm-up step and a captured step; replay() runs it and returns the bytes
-- (on the cpu, a smoke test of this file's logic, eager steps stand in for the graph)
local function graphed(seed)
  local m = module(seed)
  if DEV == "cpu" then
    return { module = m, graph = { destroy = function() end }, first = eager_step(m),
             replay = function() return eager_step(m) end }
  end
  local out, dq, dk, dv
  local g = lutra.graph.capture(function()
    out = m:forward(inputs[1], inputs[2], inputs[3])
    dq, dk, dv = m:backward(inputs[4])
  end, { warmup = 1 })
  local r = { module = m, graph = g, first = bytes_of(out, dq, dk, dv) }
  function r.replay()
    g:replay()
    return bytes_of(out, dq, dk, dv)
  end
  return r
end

local function offset_of(m)
  local seed, offset = m:rng_state()
  return tonumber(seed), tonumber(offset)
end

describe("DotProductAttention's dropout in CUDA graphs on " .. DEV, function()
  before_each(fresh_inputs)

  test("a captured step replayed K times draws the masks of K eager steps, bit for bit", function()
    local eager, want = module(SEED), {}
    for n = 1, K + 1 do want[n] = eager_step(eager) end
    assert.are_not.equal(want[1], want[2], "two eager steps drew the same mask")
    local r = graphed(SEED)
    assert.are.equal(want[1], r.first, "the warm-up step")
    for n = 2, K + 1 do
      assert.are.equal(want[n], r.replay(), "replay " .. (n - 1) .. " (step " .. n .. ")")
    end
    -- the generator went on by one offset step per forward, replays included
    local seed, offset = offset_of(r.module)
    assert.are.same({ SEED, (K + 1) * lutra.C.LUTRA_ATTENTION_OFFSET_STEP }, { seed, offset })
    assert.are.same({ offset_of(eager) }, { seed, offset })
    r.graph:destroy()
  end)

  test("a checkpoint saved after replays resumes to the same masks", function()
    local eager = module(SEED)
    for _ = 1, K + 1 do eager_step(eager) end
    local r = graphed(SEED)
    for _ = 2, K + 1 do r.replay() end
    local file = dir .. "/after_replays.safetensors"
    lutra.save(file, { model = r.module })
    local resumed = module(SEED + 7) -- another seed and offset until the load
    lutra.load(file, { model = resumed })
    assert.are.same({ offset_of(r.module) }, { offset_of(resumed) })
    local want = eager_step(eager)
    assert.are.equal(want, eager_step(resumed), "the resumed module's next step")
    assert.are.equal(want, r.replay(), "the graph's next replay")
    r.graph:destroy()
  end)

  test("a capture right after a state set on the host is refused and changes nothing", function()
    if DEV == "cpu" then return end -- CUDA graphs need cuda
    local m = module(SEED)
    eager_step(m)
    m:set_rng_state(SEED + 1, 5 * lutra.C.LUTRA_ATTENTION_OFFSET_STEP)
    local ok, err = pcall(lutra.graph.capture, function() eager_step(m) end, { warmup = 0 })
    assert.is_false(ok)
    assert.matches("a CUDA graph capture cannot write them: run a step eagerly first", err)
    assert.is_false(lutra.graph.capturing())
    assert.are.same({ SEED + 1, 5 * lutra.C.LUTRA_ATTENTION_OFFSET_STEP }, { offset_of(m) })
    -- eagerly it draws from the state set: the same step as a fresh module at that state
    local other = module(SEED + 2)
    other:set_rng_state(SEED + 1, 5 * lutra.C.LUTRA_ATTENTION_OFFSET_STEP)
    assert.are.equal(eager_step(other), eager_step(m))
  end)
end)

describe("DotProductAttention's shared workspace on " .. DEV, function()
  test("8 modules of one shape hold one deterministic-backward workspace, not 8", function()
    if DEV == "cpu" then return end -- the CPU's memory is not counted
    local was = lutra.deterministic(true) -- the deterministic backward: its dP workspace
    local ok, err = pcall(function()
      local t, n = 1024, 8
      local q = lutra.tensor({ B, t, H, D }, "bf16", DEV):randn(SEED)
      -- a module's own buffers: out, dq, dk, dv [B, t, H, D] bf16 and stats [B, H, t] f32
      local own = 4 * B * t * H * D * 2 + B * H * t * 4
      local grew = {}
      for i = 1, n do
        local before = lutra.device_memory(DEV, true) -- in use now, the peak reset to it
        local m = S.hold(nn.DotProductAttention(H, D, { dtype = "bf16", device = DEV }))
        m:forward(q, q, q)
        m:backward(q)
        local _, peak = lutra.device_memory(DEV)
        local _, deterministic = m:plans()
        assert.is_true(deterministic)
        grew[i] = peak - before
      end
      S.note("attention workspace: first module grew %d bytes, later ones %d (own buffers %d)",
             grew[1], grew[n], own)
      for i = 2, n do
        assert.is_true(grew[i] <= own + 65536, string.format(
          "module %d grew %d bytes, its own buffers are %d: a workspace of its own?", i, grew[i], own))
      end
    end)
    lutra.deterministic(was)
    assert(ok, err)
  end)
end)

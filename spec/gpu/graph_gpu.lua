-- CUDA graphs of whole training steps (lutra.graph): N replays of a captured step must leave
-- the model exactly where N eager steps leave it (bit for bit: every kernel of the step is
-- deterministic, and the optimizer's step count lives on the device), and what a graph cannot
-- hold must be refused at capture time with an error naming it.
-- On the CPU (LUTRA_TEST_DEVICE=cpu) graphs do not exist: the suite checks that refusal.
local lutra = require("lutra")
local nn, R = lutra.nn, lutra.recipe
local S = require("spec.gpu.support")
local DEV, hold = S.DEV, S.hold
local function test(name, fn) S.test(it, name, fn) end

local B, IN, H, OUT = 64, 64, 128, 32

-- a 4-Linear MLP, its loss, optimizer and autocast scope, the same for the same seed
local function trainer(optim, recipe)
  local t = {}
  t.net = hold(nn.Sequential(
    nn.Linear(IN, H, { seed = 1, device = DEV }), nn.GELU(),
    nn.Linear(H, H, { seed = 2, device = DEV }), nn.GELU(),
    nn.Linear(H, H, { seed = 3, device = DEV }), nn.GELU(),
    nn.Linear(H, OUT, { seed = 4, device = DEV })))
  t.loss = hold(nn.MSELoss())
  t.opt = hold(optim == "adamw" and lutra.optim.AdamW(t.net, { lr = 1e-3, weight_decay = 0.01 })
               or lutra.optim.SGD(t.net, { lr = 1e-2, momentum = 0.9 }))
  t.scope = recipe and lutra.autocast { recipe = recipe } or nil
  t.x = lutra.tensor({ B, IN }, "f32", DEV)
  t.target = lutra.tensor({ B, OUT }, "f32", DEV)
  t.step = S.training_step(t)
  return t
end

describe("CUDA graphs on " .. DEV, function()
  if DEV ~= "cuda" then
    it("are refused on the " .. DEV .. " device with a clear error", function()
      local ok, err = pcall(lutra.graph.capture, function() end, { device = DEV })
      assert.is_false(ok)
      assert.matches("lutra_graph_begin: CUDA graphs need the cuda device", err, 1, true)
      assert.is_false(lutra.graph.capturing())
    end)
    return
  end

  local CASES = {
    { name = "f32, SGD with momentum", optim = "sgd" },
    { name = "f32, AdamW (device-side step count)", optim = "adamw" },
    { name = "FP8 delayed scaling, AdamW (scale update inside the graph)", optim = "adamw",
      recipe = function() return R.delayed { amax_history_len = 4 } end },
    { name = "FP8 current scaling, AdamW", optim = "adamw", recipe = function() return R.current {} end },
  }
  for _, case in ipairs(CASES) do
    test(case.name .. ": N replays equal N eager steps, bit for bit", function()
      local N = 6
      local feed = S.batch_feed(N, { B, IN }, { B, OUT }, 500, 600)
      local eager = trainer(case.optim, case.recipe and case.recipe())
      local graphed = trainer(case.optim, case.recipe and case.recipe())
      S.eager_steps(eager, N, feed)
      local nodes
      local g = S.replayed_steps(graphed, N, feed, function(graph)
        nodes = graph:info()
        assert.is_true(nodes >= 10, "the graph holds the step's kernels (" .. nodes .. " nodes)")
      end)
      assert.are.same({ nodes, N - 1 }, { g:info() })
      S.assert_same_params(eager, graphed, case.name)
      assert.are.equal(eager.loss:value(), graphed.loss:value(), "last loss")
      g:destroy()
    end)
  end

  test("a buffer freed during a capture is freed when it ends, not at each replay", function()
    local t = trainer("sgd")
    t.x:randn(1)
    t.target:randn(2)
    t.step()
    local extra = lutra.tensor({ 1024, 1024 }, "f32", DEV):fill(1)
    local g = lutra.graph.capture(function()
      t.step()
      extra:destroy() -- a free node in the graph would free it again at every replay
    end, { warmup = 0 })
    assert.is_true(extra:is_freed())
    for _ = 1, 3 do g:replay() end
    lutra.synchronize(DEV)
    assert.is_true(S.isfinite(t.loss:value()))
    g:destroy()
  end)

  test("refuses what a graph cannot hold, and stays usable after", function()
    local t = trainer("sgd")
    t.x:randn(1)
    t.target:randn(2)
    t.step()
    local cases = {
      { "a new shape", function() t.net:forward(lutra.tensor({ 2 * B, IN }, "f32", DEV)) end,
        "while capturing a CUDA graph" },
      { "reading the loss", function() t.step(); return t.loss:value() end,
        "reading device memory on the host" },
      { "a cpu tensor", function() lutra.tensor({ 4 }, "f32", "cpu"):fill(1) end,
        "work on the cpu device while capturing a CUDA graph" },
      { "a synchronization", function() lutra.synchronize(DEV) end, "a synchronization while capturing" },
      { "uploading values", function() t.x:randn(3) end, "host-to-device copy" },
    }
    for _, case in ipairs(cases) do
      local ok, err = pcall(lutra.graph.capture, case[2], { warmup = 0 })
      assert.is_false(ok, case[1])
      assert.matches(case[3], err, 1, true)
      assert.is_false(lutra.graph.capturing(), case[1] .. ": the capture was discarded")
      t.step() -- eager work goes on
    end
    lutra.synchronize(DEV)
    assert.is_true(S.isfinite(t.loss:value()))
  end)
end)

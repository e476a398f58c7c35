-- Process groups on the device: one rank (the H200 machine has one GPU), so every collective
-- goes through NCCL on lutra's stream with a communicator of one; multi-GPU runs are their own
-- issue. Run it as a plain GPU spec (MPI then starts as a singleton) or under `mpirun -np 1`:
--   NCCL_NVLS_ENABLE=0 make test-gpu CUDA=1
--   NCCL_NVLS_ENABLE=0 LUA_PATH="lua/?.lua;lua/?/init.lua;;" mpirun --allow-run-as-root -np 1 \
--     luajit /usr/bin/busted --lpath="lua/?.lua;lua/?/init.lua" --pattern=dist_gpu spec/gpu
-- Against the CPU backend: tensor-parallel Linear (column / row / sequence parallel) vs the
-- plain Linear, the autocast amax all-reduce (counted, and the same scales as without a group),
-- data-parallel gradient buckets (the optimizer step waiting for them by itself, and a
-- data-parallel step captured in a CUDA graph), and a tensor-parallel step captured in a CUDA
-- graph (NCCL inside the capture) replaying to the eager results. LUTRA_TEST_DEVICE=cpu smoke-tests it on
-- the CPU (MPI collectives of one rank; the graph test is then pending).
local lutra = require("lutra")
local S = require("spec.gpu.support")
local DEV, REF = S.DEV, S.REF
local function test(name, fn) S.test(it, name, fn) end

local world
local function group()
  if not world then
    lutra.dist.init()
    world = lutra.dist.world()
  end
  return world:split(0, 0)
end

local IN, OUT, ROWS = 64, 32, 16

-- the plain Linear on REF and the parallel one on DEV from the same parameters
local function pair(mode, sp, g, dtype)
  local ref = lutra.nn.Linear(IN, OUT, { seed = 9, dtype = dtype, device = REF })
  local par = lutra.nn.Linear(IN, OUT, { seed = 3, dtype = dtype, device = DEV,
                                         parallel_mode = mode, tp_group = g,
                                         sequence_parallel = sp })
  local rp, pp = ref:parameters(), par:parameters()
  for i = 1, #rp do pp[i].value:copy(lutra.tensor(rp[i].value:dims(), dtype, DEV):set(rp[i].value:to_table())) end
  return ref, par
end

local function on_dev(t, dtype)
  return lutra.tensor(t:dims(), dtype, DEV):set(t:to_table())
end

describe("dist on " .. DEV .. " (one rank)", function()
  if not lutra.dist.available() then
    pending("skipped: liblutra was built without MPI")
    return
  end

  for _, dtype in ipairs({ "f32", "bf16" }) do
    for _, mode in ipairs({ "column", "row" }) do
      for _, sp in ipairs({ false, true }) do
        test(string.format("%s %s-parallel%s Linear equals the plain Linear on the cpu", dtype, mode,
                           sp and " + SP" or ""), function()
          local g = group()
          local ref, par = pair(mode, sp, g, dtype)
          local bound = dtype == "f32" and 1e-10 or 1e-4
          local x = lutra.tensor({ ROWS, IN }, dtype, REF):randn(41)
          local dy = lutra.tensor({ ROWS, OUT }, dtype, REF):randn(42)
          local before = g:stats()
          for _ = 1, 2 do -- twice: reused buffers hold the previous call's values
            local y_ref, y = ref:forward(x), par:forward(on_dev(x, dtype))
            S.assert_nmse(S.keep(y), y_ref, bound, "y")
            local dx_ref, dx = ref:backward(dy), par:backward(on_dev(dy, dtype))
            S.assert_nmse(dx, dx_ref, bound, "dx")
          end
          local rp, pp = ref:parameters(), par:parameters()
          S.assert_nmse(pp[1].grad, rp[1].grad, bound, "dW")
          S.assert_nmse(pp[2].grad, rp[2].grad, bound, "dbias")
          local after = g:stats()
          local per = sp and 0 or 2 -- one all-reduce per step (column: dgrad; row: output)
          assert.are.equal(per, after.all_reduce - before.all_reduce)
          assert.are.equal((sp and 2 or 0), after.all_gather - before.all_gather)
          assert.are.equal((sp and 2 or 0), after.reduce_scatter - before.reduce_scatter)
        end)
      end
    end
  end

  test("autocast with a group: one amax all-reduce forward and one backward per step, the "
       .. "scales a run without the group gets", function()
    local g = group()
    local r = lutra.recipe.delayed({ amax_history_len = 4 })
    for _, depth in ipairs({ 1, 4 }) do
      local function make()
        local layers = {}
        for i = 1, depth do layers[i] = lutra.nn.Linear(IN, IN, { seed = i, device = DEV }) end
        return lutra.nn.Sequential(unpack(layers)), layers
      end
      local a, la = make()
      local b, lb = make()
      local sa, sb = lutra.autocast({ recipe = r, group = g }), lutra.autocast({ recipe = r })
      local x = lutra.tensor({ ROWS, IN }, "f32", DEV):randn(7)
      local dy = lutra.tensor({ ROWS, IN }, "f32", DEV):randn(8)
      local before = g:stats()
      for _ = 1, 3 do
        sa:enter(); a:forward(x); sa:exit(); a:backward(dy)
        sb:enter(); b:forward(x); sb:exit(); b:backward(dy)
      end
      local after = g:stats()
      assert.are.equal(6, after.amax_reduce - before.amax_reduce)
      for i = 1, depth do
        for _, role in ipairs({ "input", "weight", "grad_output" }) do
          assert.are.same(lb[i]:quantizer(role):history(4), la[i]:quantizer(role):history(4),
                          "layer " .. i .. " " .. role)
        end
      end
    end
  end)

  test("data-parallel buckets over one rank leave the gradients as they are, one collective "
       .. "per bucket", function()
    local g = group()
    local net = lutra.nn.Sequential(lutra.nn.Linear(IN, OUT, { device = DEV }),
                                    lutra.nn.Linear(OUT, OUT, { device = DEV }))
    local x = lutra.tensor({ ROWS, IN }, "f32", DEV):randn(1)
    net:forward(x)
    net:backward(lutra.tensor({ ROWS, OUT }, "f32", DEV):randn(2))
    local want = {}
    for i, p in ipairs(net:parameters()) do want[i] = p.grad:to_table() end
    local sync = lutra.dist.grad_sync(g, net, { bucket_bytes = (IN * OUT + OUT) * 4 })
    local buckets = sync:info()
    local before = g:stats().all_reduce
    sync:run()
    assert.are.equal(buckets, g:stats().all_reduce - before)
    assert.are.equal(2, buckets)
    for i, p in ipairs(net:parameters()) do assert.are.same(want[i], p.grad:to_table()) end
  end)

  test("data-parallel buckets armed before the backward (the comm stream on cuda) start inside "
       .. "it and leave one rank's gradients as they are", function()
    local g = group()
    local net = lutra.nn.Sequential(lutra.nn.Linear(IN, OUT, { device = DEV, seed = 5 }),
                                    lutra.nn.Linear(OUT, OUT, { device = DEV, seed = 6 }))
    local x = lutra.tensor({ ROWS, IN }, "f32", DEV):randn(1)
    local dy = lutra.tensor({ ROWS, OUT }, "f32", DEV):randn(2)
    net:forward(x)
    net:backward(dy)
    local want = {}
    for i, p in ipairs(net:parameters()) do want[i] = p.grad:to_table() end
    local sync = lutra.dist.grad_sync(g, net, { bucket_bytes = (OUT * OUT + OUT) * 4 })
    for _ = 1, 2 do
      net:forward(x)
      sync:begin()
      net:backward(dy)
      local buckets, _, early = sync:info()
      assert.are.equal(buckets, early)
      sync:finish()
      for i, p in ipairs(net:parameters()) do assert.are.same(want[i], p.grad:to_table()) end
    end
  end)

  -- a data-parallel trainer: begin, backward, optimizer step with no finish (the step waits)
  local function dp_trainer(g, optim)
    local t = {}
    t.net = lutra.nn.Sequential(lutra.nn.Linear(IN, OUT, { device = DEV, seed = 7 }),
                                lutra.nn.GELU(),
                                lutra.nn.Linear(OUT, OUT, { device = DEV, seed = 8 }))
    t.opt = optim == "adamw" and lutra.optim.AdamW(t.net, { lr = 1e-3 })
            or lutra.optim.SGD(t.net, { lr = 1e-2, momentum = 0.9 })
    t.sync = g and lutra.dist.grad_sync(g, t.net, { bucket_bytes = (OUT * OUT + OUT) * 4 })
    t.loss = lutra.nn.MSELoss()
    t.x = lutra.tensor({ ROWS, IN }, "f32", DEV)
    t.target = lutra.tensor({ ROWS, OUT }, "f32", DEV)
    t.step = function()
      t.loss:forward(t.net:forward(t.x), t.target)
      if t.sync then t.sync:begin() end
      t.net:backward(t.loss:backward())
      t.opt:step()
    end
    return t
  end
  local same_params = S.assert_same_params

  for _, optim in ipairs({ "sgd", "adamw" }) do
    test(optim .. ": the optimizer step waits for the data-parallel buckets by itself (on cuda "
         .. "its stream waits for the comm stream's event); one rank's steps equal steps with no "
         .. "sync, bit for bit", function()
      local g = group()
      local synced, plain = dp_trainer(g, optim), dp_trainer(nil, optim)
      for i = 1, 3 do
        for _, t in ipairs({ synced, plain }) do
          t.x:randn(60 + i)
          t.target:randn(70 + i)
          t.step()
        end
        local buckets, _, early = synced.sync:info()
        assert.are.equal(buckets, early)
        synced.sync:finish() -- the step finished it: nothing left
        same_params(synced, plain, "step " .. i)
      end
    end)
  end

  -- a test of a CUDA graph, given the group: pending on other devices
  local function graph_test(name, fn)
    test(name, function()
      if DEV ~= "cuda" then
        pending("CUDA graphs need the cuda device")
        return
      end
      fn(group())
    end)
  end

  graph_test("a data-parallel step (begin, backward, optimizer step waiting for the comm "
             .. "stream) captured in a CUDA graph: N replays equal N eager steps, bit for bit",
             function(g)
    local N = 4
    local eager, graphed = dp_trainer(g, "adamw"), dp_trainer(g, "adamw")
    local feed = S.batch_feed(N, { ROWS, IN }, { ROWS, OUT }, 80, 90)
    S.eager_steps(eager, N, feed)
    local before = g:stats().all_reduce
    local graph = S.replayed_steps(graphed, N, feed)
    -- the warm-up and the capture issue the buckets' collectives; replays issue none on the host
    assert.are.equal(2 * graphed.sync:info(), g:stats().all_reduce - before)
    same_params(eager, graphed, "after the replays")
    graph:destroy()
  end)

  graph_test("a tensor-parallel step captured in a CUDA graph (NCCL inside) replays to the "
             .. "eager results", function(g)
    local m1 = lutra.nn.Linear(IN, OUT, { device = DEV, parallel_mode = "column", tp_group = g,
                                          seed = 1 })
    local m2 = lutra.nn.Linear(OUT, IN, { device = DEV, parallel_mode = "row", tp_group = g,
                                          seed = 2 })
    local net = lutra.nn.Sequential(m1, m2)
    local x = lutra.tensor({ ROWS, IN }, "f32", DEV):randn(3)
    local dy = lutra.tensor({ ROWS, IN }, "f32", DEV):randn(4)
    local y, dx
    local function step() y = net:forward(x); dx = net:backward(dy) end
    step()
    local y_eager, dx_eager = y:to_table(), dx:to_table()
    local graph = lutra.graph.capture(step, { warmup = 1 })
    y:fill(0 / 0)
    dx:fill(0 / 0)
    graph:replay()
    assert.are.same(y_eager, y:to_table())
    assert.are.same(dx_eager, dx:to_table())
  end)
end)

-- The norm-fused and grouped modules' tensor-parallel forms on one rank (NCCL with a
-- communicator of one on cuda) against the plain module on the CPU from the same parameters:
-- LayerNormLinear (column, with and without SP; SP under delayed FP8 with the group gathers the
-- norm's FP8 codes), LayerNormMLP (gelu and swiglu, with and without SP) and GroupedLinear
-- (column and row), with their collectives counted.
describe("tensor-parallel norm-fused and grouped modules on " .. DEV .. " (one rank)", function()
  if not lutra.dist.available() then
    pending("skipped: liblutra was built without MPI")
    return
  end

  local function copy_params(ref, par, dtype)
    local rp, pp = ref:parameters(), par:parameters()
    assert.are.equal(#rp, #pp)
    for i = 1, #rp do pp[i].value:copy(on_dev(rp[i].value, dtype)) end
    return rp, pp
  end

  -- forward and backward twice on both, outputs and every gradient within bound; the group's
  -- collectives over the two steps returned
  local function run_pair(ref, par, g, x, dy, bound, fwd, scopes)
    local before = g:stats()
    for _ = 1, 2 do
      if scopes then scopes[1]:enter() end
      local y_ref = fwd(ref, x)
      if scopes then scopes[1]:exit(); scopes[2]:enter() end
      local y = fwd(par, on_dev(x, x:dtype_name()))
      if scopes then scopes[2]:exit() end
      S.assert_nmse(S.keep(y), y_ref, bound, "y")
      local dx_ref, dx = ref:backward(dy), par:backward(on_dev(dy, dy:dtype_name()))
      S.assert_nmse(dx, dx_ref, bound, "dx")
    end
    local rp, pp = ref:parameters(), par:parameters()
    for i = 1, #rp do S.assert_nmse(pp[i].grad, rp[i].grad, bound, "gradient " .. i) end
    local after = g:stats()
    return after.all_reduce - before.all_reduce, after.all_gather - before.all_gather,
           after.reduce_scatter - before.reduce_scatter
  end
  local function plain(m, x) return m:forward(x) end

  for _, dtype in ipairs({ "f32", "bf16" }) do
    local bound = dtype == "f32" and 1e-10 or 1e-4
    for _, sp in ipairs({ false, true }) do
      test(string.format("%s column-parallel LayerNormLinear%s equals the plain one on the cpu",
                         dtype, sp and " + SP" or ""), function()
        local g = group()
        local ref = lutra.nn.LayerNormLinear(IN, OUT, { seed = 9, dtype = dtype, device = REF })
        local par = lutra.nn.LayerNormLinear(IN, OUT, { seed = 3, dtype = dtype, device = DEV,
          parallel_mode = "column", tp_group = g, sequence_parallel = sp })
        copy_params(ref, par, dtype)
        local x = lutra.tensor({ ROWS, IN }, dtype, REF):randn(51)
        local dy = lutra.tensor({ ROWS, OUT }, dtype, REF):randn(52)
        local ar, ag, rs = run_pair(ref, par, g, x, dy, bound, plain)
        assert.are.same(sp and { 0, 2, 2 } or { 2, 0, 0 }, { ar, ag, rs })
      end)

      for _, act in ipairs({ "gelu", "swiglu" }) do
        test(string.format("%s LayerNormMLP (%s) over a group%s equals the plain one on the cpu",
                           dtype, act, sp and " + SP" or ""), function()
          local g = group()
          local ref = lutra.nn.LayerNormMLP(IN, OUT, { activation = act, seed = 9, dtype = dtype,
                                                       device = REF })
          local par = lutra.nn.LayerNormMLP(IN, OUT, { activation = act, seed = 3, dtype = dtype,
            device = DEV, tp_group = g, sequence_parallel = sp })
          copy_params(ref, par, dtype)
          local x = lutra.tensor({ ROWS, IN }, dtype, REF):randn(53)
          local dy = lutra.tensor({ ROWS, IN }, dtype, REF):randn(54)
          local ar, ag, rs = run_pair(ref, par, g, x, dy, bound, plain)
          assert.are.same(sp and { 0, 4, 4 } or { 4, 0, 0 }, { ar, ag, rs })
        end)
      end
    end

    -- GroupedLinear's grouped GEMM on cuda runs in bf16 only (it has no f32 kernels)
    local grouped_modes = (dtype == "f32" and DEV == "cuda") and {} or { "column", "row" }
    for _, mode in ipairs(grouped_modes) do
      test(string.format("%s %s-parallel GroupedLinear equals the plain one on the cpu", dtype,
                         mode), function()
        local g = group()
        local ref = lutra.nn.GroupedLinear(3, IN, OUT, { seed = 9, dtype = dtype, device = REF })
        local par = lutra.nn.GroupedLinear(3, IN, OUT, { seed = 3, dtype = dtype, device = DEV,
                                                         parallel_mode = mode, tp_group = g })
        copy_params(ref, par, dtype)
        local x = lutra.tensor({ ROWS, IN }, dtype, REF):randn(55)
        local dy = lutra.tensor({ ROWS, OUT }, dtype, REF):randn(56)
        local splits = { 5, 0, ROWS - 5 }
        local ar = run_pair(ref, par, g, x, dy, bound,
                            function(m, t) return m:forward(t, splits) end)
        assert.are.equal(2, ar) -- one per step: row the output, column the input gradient
      end)
    end
  end

  test("column-parallel LayerNormLinear + SP under delayed FP8 with the group gathers the norm's "
       .. "FP8 codes and matches the plain one on the cpu", function()
    local g = group()
    local ref = lutra.nn.LayerNormLinear(IN, OUT, { seed = 9, device = REF })
    local par = lutra.nn.LayerNormLinear(IN, OUT, { seed = 3, device = DEV,
      parallel_mode = "column", tp_group = g, sequence_parallel = true })
    copy_params(ref, par, "f32")
    local r = lutra.recipe.delayed({ amax_history_len = 4 })
    local scopes = { lutra.autocast({ recipe = r }), lutra.autocast({ recipe = r, group = g }) }
    local x = lutra.tensor({ ROWS, IN }, "f32", REF):randn(57)
    local dy = lutra.tensor({ ROWS, OUT }, "f32", REF):randn(58)
    -- FP8 GEMMs on the device and the CPU's emulation accumulate in other orders
    local _, ag = run_pair(ref, par, g, x, dy, 1e-4, plain, scopes)
    -- a group of one gathers nothing: the codes the norm wrote are the whole input already
    assert.are.equal(g:size() > 1 and 2 or 0, ag)
    assert.is_true(par:norm_fused(), "the norm wrote the FP8 codes")
  end)
end)

-- Process groups on the device: one rank (the H200 machine has one GPU), so every collective
-- goes through NCCL on lutra's stream with a communicator of one; multi-GPU runs are their own
-- issue. Run it as a plain GPU spec (MPI then starts as a singleton) or under `mpirun -np 1`:
--   NCCL_NVLS_ENABLE=0 make test-gpu CUDA=1
--   NCCL_NVLS_ENABLE=0 LUA_PATH="lua/?.lua;lua/?/init.lua;;" mpirun --allow-run-as-root -np 1 \
--     luajit /usr/bin/busted --lpath="lua/?.lua;lua/?/init.lua" --pattern=dist_gpu spec/gpu
-- Against the CPU backend: tensor-parallel Linear (column / row / sequence parallel) vs the
-- plain Linear, the autocast amax all-reduce (counted, and the same scales as without a group),
-- data-parallel gradient buckets, and a tensor-parallel step captured in a CUDA graph (NCCL
-- inside the capture) replaying to the eager results. LUTRA_TEST_DEVICE=cpu smoke-tests it on
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

  test("a tensor-parallel step captured in a CUDA graph (NCCL inside) replays to the eager "
       .. "results", function()
    if DEV ~= "cuda" then
      pending("CUDA graphs need the cuda device")
      return
    end
    local g = group()
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

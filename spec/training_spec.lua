-- End-to-end training in f32 and under each FP8 recipe, and single optimizer steps against
-- hand-computed PyTorch updates.
--
-- Regression: a student Sequential(Linear(32,64), GELU, Linear(64,32)) learns the outputs of a
-- fixed random teacher of the same shape on 64 fixed inputs (full batch), AdamW lr=1e-2,
-- weight_decay=0, 150 steps, from the same initial weights (same seeds) in every run.
--   - every run must end below 0.1x its first loss (measured: f32 ~1e-4x, FP8 ~2e-3x);
--   - FP8 final <= f32 final + 0.02 * first loss. Why this band: FP8 training stalls at a
--     noise floor set by the quantization error of activations, weights and gradients
--     (relative error ~4-6% per GEMM), which measured at ~0.002x the first loss for every
--     recipe, while f32 keeps going down. 0.02x leaves a 10x margin over that floor and still
--     fails a run whose FP8 path breaks training (e.g. wrong scales: loss stuck near the start).
--   - the FP8 runs must really differ from f32 (their first losses are not equal).
-- Classification: the same MLP shape with 16 classes given by argmax of a random linear map,
-- CrossEntropyLoss, SGD lr=0.1 momentum=0.9, 150 steps: loss below 0.1x the first and at least
-- 95% training accuracy (measured: 100%, loss 0.0016x), in f32 and under current scaling.
local lutra = require("lutra")

local recipes = {
  { name = "delayed", make = function() return lutra.recipe.delayed{ amax_history_len = 16 } end },
  { name = "current", make = function() return lutra.recipe.current{} end },
  { name = "mxfp8", make = function() return lutra.recipe.mxfp8{} end },
  { name = "block", make = function() return lutra.recipe.block{} end },
}

local function mlp(d_in, d_hid, d_out, seed)
  return lutra.nn.Sequential(lutra.nn.Linear(d_in, d_hid, { seed = seed }), lutra.nn.GELU(),
                             lutra.nn.Linear(d_hid, d_out, { seed = seed + 1 }))
end

-- Trains net for `steps` full-batch steps; returns the first and the last loss.
local function train(net, loss, opt, x, target, steps, scope)
  local first, last
  for step = 1, steps do
    if scope then scope:enter() end
    local y = net:forward(x)
    loss:forward(y, target)
    net:backward(loss:backward())
    if scope then scope:exit() end
    opt:step()
    last = loss:value()
    if step == 1 then first = last end
  end
  return first, last
end

describe("training", function()
  it("MLP regression with AdamW converges in f32 and under every FP8 recipe", function()
    local N = 64
    local x = lutra.tensor({ N, 32 }):randn(3001)
    local teacher = mlp(32, 64, 32, 3100)
    local target = lutra.tensor({ N, 32 }):copy(teacher:forward(x))

    local results = {}
    local runs = { { name = "f32" } }
    for _, rc in ipairs(recipes) do runs[#runs + 1] = rc end
    for _, run in ipairs(runs) do
      local net = mlp(32, 64, 32, 3200) -- identical initial weights in every run
      local loss = lutra.nn.MSELoss()
      local opt = lutra.optim.AdamW(net, { lr = 1e-2, weight_decay = 0 })
      local scope = run.make and lutra.autocast{ recipe = run.make() } or nil
      local first, last = train(net, loss, opt, x, target, 150, scope)
      results[run.name] = { first = first, last = last }
      assert.is_true(first > 0 and last == last, run.name .. ": bad loss")
      assert.is_true(last < 0.1 * first,
        string.format("%s: final loss %.4g is not below 0.1x the first %.4g", run.name, last,
                      first))
    end
    local f = results.f32
    for _, rc in ipairs(recipes) do
      local r = results[rc.name]
      assert.are_not.equal(f.first, r.first, rc.name .. ": first loss equals f32 (FP8 not used?)")
      assert.is_true(math.abs(r.first - f.first) < 0.05 * f.first,
        string.format("%s: first loss %.5g far from f32 %.5g", rc.name, r.first, f.first))
      assert.is_true(r.last <= f.last + 0.02 * r.first,
        string.format("%s: final loss %.4g vs f32 final %.4g (first %.4g)", rc.name, r.last,
                      f.last, r.first))
    end
  end)

  it("classification with CrossEntropyLoss and SGD with momentum", function()
    local N, D, K = 128, 32, 16
    local x = lutra.tensor({ N, D }):randn(3301)
    local xs = x:to_table()
    local A = lutra.tensor({ K, D }):randn(3302):to_table()
    local labels = {}
    for i = 0, N - 1 do
      local best, arg = -math.huge, 0
      for c = 0, K - 1 do
        local s = 0
        for k = 1, D do s = s + xs[i * D + k] * A[c * D + k] end
        if s > best then best, arg = s, c end
      end
      labels[i + 1] = arg
    end
    local target = lutra.from_table(labels, { N }, "i32")

    for _, run in ipairs({ { name = "f32" }, recipes[2] }) do
      local net = mlp(D, 64, K, 3400)
      local loss = lutra.nn.CrossEntropyLoss()
      local opt = lutra.optim.SGD(net, { lr = 0.1, momentum = 0.9 })
      local scope = run.make and lutra.autocast{ recipe = run.make() } or nil
      local first, last = train(net, loss, opt, x, target, 150, scope)
      assert.is_true(first > 2.0, run.name .. ": first loss should be near log(16)")
      assert.is_true(last < 0.1 * first,
        string.format("%s: final loss %.4g vs first %.4g", run.name, last, first))
      local y = net:forward(x):to_table()
      local correct = 0
      for i = 0, N - 1 do
        local best, arg = -math.huge, -1
        for c = 0, K - 1 do
          if y[i * K + c + 1] > best then best, arg = y[i * K + c + 1], c end
        end
        if arg == labels[i + 1] then correct = correct + 1 end
      end
      assert.is_true(correct >= 0.95 * N,
        string.format("%s: training accuracy %d/%d", run.name, correct, N))
    end
  end)

  describe("optimizer steps match hand-computed PyTorch updates", function()
    local IN, OUT = 5, 3

    -- A Linear with given weights and bias, and a function setting its grads.
    local function setup(seed, opts)
      local m = lutra.nn.Linear(IN, OUT, opts or { seed = seed })
      local p = m:parameters()
      local w = lutra.tensor({ OUT * IN }):uniform(seed, -1, 1):to_table()
      local b = lutra.tensor({ OUT }):uniform(seed + 1, -1, 1):to_table()
      p[1].value:set(w)
      p[2].value:set(b)
      return m, p, { p[1].value:to_table(), p[2].value:to_table() }
    end

    local function grads(seed, scale)
      return { lutra.tensor({ OUT * IN }):randn(seed, 0, scale):to_table(),
               lutra.tensor({ OUT }):randn(seed + 1, 0, scale):to_table() }
    end

    local function check(p, ref, what, tol)
      for t = 1, 2 do
        local got = p[t].value:to_table()
        for i = 1, #got do
          local e = math.abs(got[i] - ref[t][i])
          if e > tol * (1 + math.abs(ref[t][i])) then
            assert.is_true(false, string.format("%s: param %d element %d is %.9g, expected %.9g",
                                                what, t, i, got[i], ref[t][i]))
          end
        end
      end
    end

    it("SGD with momentum and weight decay (L2 added to the gradient), three steps", function()
      local lr, mu, wd = 0.05, 0.9, 0.1
      local m, p, w = setup(3501)
      local opt = lutra.optim.SGD(m, { lr = lr, momentum = mu, weight_decay = wd })
      local buf = { {}, {} }
      for step = 1, 3 do
        local g = grads(3510 + 10 * step, 1)
        p[1].grad:set(g[1])
        p[2].grad:set(g[2])
        opt:step()
        for t = 1, 2 do
          for i = 1, #w[t] do
            local d = g[t][i] + wd * w[t][i]
            buf[t][i] = step == 1 and d or mu * buf[t][i] + d
            w[t][i] = w[t][i] - lr * buf[t][i]
          end
        end
        check(p, w, "SGD step " .. step, 2e-6)
      end
    end)

    it("plain SGD (no momentum, no decay) is w -= lr * g", function()
      local lr = 0.3
      local m, p, w = setup(3601)
      local opt = lutra.optim.SGD(m, { lr = lr })
      local g = grads(3602, 2)
      p[1].grad:set(g[1])
      p[2].grad:set(g[2])
      opt:step()
      for t = 1, 2 do for i = 1, #w[t] do w[t][i] = w[t][i] - lr * g[t][i] end end
      check(p, w, "plain SGD", 1e-6)
    end)

    it("AdamW: decoupled decay, moments and bias correction, three steps", function()
      local lr, wd, b1, b2, eps = 0.01, 0.1, 0.8, 0.95, 1e-3
      local m, p, w = setup(3701)
      local opt = lutra.optim.AdamW(m, { lr = lr, weight_decay = wd, beta1 = b1, beta2 = b2,
                                         eps = eps })
      local mo, v = { {}, {} }, { {}, {} }
      for t = 1, 2 do for i = 1, #w[t] do mo[t][i], v[t][i] = 0, 0 end end
      for step = 1, 3 do
        -- gradients of mixed size, so eps and the second moment both matter
        local g = grads(3710 + 10 * step, step == 2 and 0.01 or 1)
        p[1].grad:set(g[1])
        p[2].grad:set(g[2])
        opt:step()
        local bc1, bc2 = 1 - b1 ^ step, 1 - b2 ^ step
        for t = 1, 2 do
          for i = 1, #w[t] do
            -- AdamW's default decay groups: the weight (2-D) decays, the bias (1-D) does not
            if t == 1 then w[t][i] = w[t][i] * (1 - lr * wd) end
            mo[t][i] = b1 * mo[t][i] + (1 - b1) * g[t][i]
            v[t][i] = b2 * v[t][i] + (1 - b2) * g[t][i] ^ 2
            w[t][i] = w[t][i] - lr * (mo[t][i] / bc1) / (math.sqrt(v[t][i] / bc2) + eps)
          end
        end
        check(p, w, "AdamW step " .. step, 2e-6)
      end
    end)

    it("SGD on bf16 parameters keeps f32 master weights (small updates are not lost)", function()
      local m = lutra.nn.Linear(4, 2, { dtype = "bf16", seed = 1 })
      local p = m:parameters()
      p[1].value:set({ 1, -1, 0.5, 2, 1, 1, 1, 1 })
      p[2].value:set({ 1, -2 })
      local opt = lutra.optim.SGD(m, { lr = 1e-3 })
      p[1].grad:set({ 1, 1, 1, 1, 1, 1, 1, 1 })
      p[2].grad:set({ 1, -1 })
      -- each update (1e-3) is below half a bf16 ulp at 1.0 (2^-8): without masters nothing moves
      for _ = 1, 10 do opt:step() end
      local w, b = p[1].value:to_table(), p[2].value:to_table()
      -- masters after ten steps: 1 - 0.01 = 0.99 -> bf16 0.98828125 (spacing 2^-8 below 1);
      -- -1 - 0.01 -> -1.0078125 and -2 + 0.01 -> -1.9921875 (spacing 2^-7); 0.49 -> 0.490234375
      assert.are.same({ 0.98828125, -1.0078125, 0.490234375, 1.9921875,
                        0.98828125, 0.98828125, 0.98828125, 0.98828125 }, w)
      assert.are.same({ 0.98828125, -1.9921875 }, b)
    end)
  end)
end)

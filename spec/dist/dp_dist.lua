-- Data parallel under mpirun: each rank trains on its rows of one batch and averages its
-- gradients over the group (lutra.dist.grad_sync, bucketed); the result equals one process
-- training on the whole batch (f32: within reassociation of the average; bf16 parameters with
-- f32 masters: within bf16 rounding of the gradients), gradients and the parameters after the
-- optimizer step.
local lutra = require("lutra")
local D = require("spec.dist.support")

local IN, HID, OUT = 16, 32, 8

local function net(opts)
  return lutra.nn.Sequential(lutra.nn.Linear(IN, HID, { seed = 1, dtype = opts.dtype,
                                                        accumulate_main_grad = opts.main }),
                             lutra.nn.GELU(),
                             lutra.nn.Linear(HID, OUT, { seed = 2, dtype = opts.dtype,
                                                         accumulate_main_grad = opts.main }))
end

local function rows(t, cols, r0, r1, dtype)
  local v, out = t:to_table(), {}
  for r = r0, r1 - 1 do for c = 1, cols do out[#out + 1] = v[r * cols + c] end end
  local s = lutra.tensor({ r1 - r0, cols }, dtype)
  s:set(out)
  return s
end

local function step(m, opt, x, target)
  local loss = lutra.nn.MSELoss()
  loss:forward(m:forward(x), target)
  m:backward(loss:backward(), false)
  return opt
end

local function grads(m, main)
  local out = {}
  for _, p in ipairs(m:parameters()) do out[#out + 1] = (main and p.main_grad or p.grad):to_table() end
  return out
end

local function values(m)
  local out = {}
  for _, p in ipairs(m:parameters()) do out[#out + 1] = p.value:to_table() end
  return out
end

local function close(got, want, tol, what)
  for i = 1, #want do
    local e = D.nmse(got[i], want[i])
    assert.is_true(e < tol, string.format("%s %d: nmse %g (tolerance %g)", what, i, e, tol))
  end
end

describe("dist data parallel", function()
  local w = D.world()
  local rank, n = w:rank(), w:size()
  local B = 4 * n

  for _, cfg in ipairs({ { dtype = "f32", tol = 1e-12 },
                         { dtype = "f32", main = true, tol = 1e-12 },
                         { dtype = "bf16", tol = 1e-4, vtol = 1e-4 } }) do
    local what = cfg.dtype .. (cfg.main and " with accumulate_main_grad" or "")
    it(what .. ": the batch split over the ranks equals one rank with the whole batch", function()
      local dtype = cfg.dtype
      local X = D.rank_data(B * IN, 0, 61, dtype):reshape({ B, IN })
      local T = D.rank_data(B * OUT, 0, 62, dtype):reshape({ B, OUT })
      local whole = net(cfg)
      local wopt = lutra.optim.SGD(whole, { lr = 0.1 })
      step(whole, wopt, X, T)
      local want = grads(whole, cfg.main)
      wopt:step()

      local mine = net(cfg)
      local opt = lutra.optim.SGD(mine, { lr = 0.1 })
      local x = rows(X, IN, rank * 4, rank * 4 + 4, dtype)
      local t = rows(T, OUT, rank * 4, rank * 4 + 4, dtype)
      step(mine, opt, x, t)
      local g = w:split(0, rank)
      -- buckets of the first layer's weight and bias, then the second's
      local es = dtype == "f32" and 4 or 2
      local sync2 = lutra.dist.grad_sync(g, mine, { bucket_bytes = (IN * HID + HID) * es })
      local buckets = sync2:info()
      local before = g:stats().all_reduce
      sync2:run()
      assert.are.equal(buckets, g:stats().all_reduce - before)
      assert.are.equal(2, buckets)
      close(grads(mine, cfg.main), want, cfg.tol, "gradient")
      opt:step()
      close(values(mine), values(whole), cfg.vtol or 1e-12, "parameter after the step")
    end)
  end
  it("armed before the backward, each bucket starts when its gradients are done", function()
    local g = w:split(0, rank)
    local X = D.rank_data(B * IN, 0, 63):reshape({ B, IN })
    local T = D.rank_data(B * OUT, 0, 64):reshape({ B, OUT })
    local whole = net({})
    step(whole, nil, X, T)
    local want = grads(whole)
    -- the same layers run one by one, to look between their backwards
    local l1 = lutra.nn.Linear(IN, HID, { seed = 1 })
    local act = lutra.nn.GELU()
    local l2 = lutra.nn.Linear(HID, OUT, { seed = 2 })
    local mine = lutra.nn.Sequential(l1, act, l2)
    -- buckets in backward order: [b2, W2], [b1], [W1]
    local sync = lutra.dist.grad_sync(g, mine, { bucket_bytes = (HID * OUT + OUT) * 4 })
    local x = rows(X, IN, rank * 4, rank * 4 + 4, "f32")
    local t = rows(T, OUT, rank * 4, rank * 4 + 4, "f32")
    for _ = 1, 2 do -- twice: the sync re-arms
      local loss = lutra.nn.MSELoss()
      loss:forward(l2:forward(act:forward(l1:forward(x))), t)
      sync:begin()
      local before = g:stats().all_reduce
      local da = l2:backward(loss:backward())
      local buckets, _, early = sync:info()
      assert.are.equal(3, buckets)
      assert.are.equal(1, early) -- the second layer's bucket runs while the first computes
      assert.are.equal(1, g:stats().all_reduce - before)
      l1:backward(act:backward(da), false)
      _, _, early = sync:info()
      assert.are.equal(3, early)
      assert.are.equal(3, g:stats().all_reduce - before)
      sync:finish()
      close(grads(mine), want, 1e-12, "gradient")
    end
    local ok, err = pcall(sync.finish, sync)
    assert.is_false(ok)
    assert.matches("lutra_grad_sync_finish: not armed", err)
  end)
end)

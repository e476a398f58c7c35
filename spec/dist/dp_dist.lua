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

-- the f32 batch of salts salt and salt + 1 (the same on every rank of w, 4 rows a rank): this
-- rank's rows of its inputs and targets, and the gradients of one process training on all of it
local function my_rows_and_whole_grads(w, salt)
  local rank, B = w:rank(), 4 * w:size()
  local X = D.rank_data(B * IN, 0, salt):reshape({ B, IN })
  local T = D.rank_data(B * OUT, 0, salt + 1):reshape({ B, OUT })
  local whole = net({})
  step(whole, nil, X, T)
  return rows(X, IN, rank * 4, rank * 4 + 4, "f32"), rows(T, OUT, rank * 4, rank * 4 + 4, "f32"),
         grads(whole)
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
    local x, t, want = my_rows_and_whole_grads(w, 63)
    -- the same layers run one by one, to look between their backwards
    local l1 = lutra.nn.Linear(IN, HID, { seed = 1 })
    local act = lutra.nn.GELU()
    local l2 = lutra.nn.Linear(HID, OUT, { seed = 2 })
    local mine = lutra.nn.Sequential(l1, act, l2)
    -- buckets in backward order: [b2, W2], [b1], [W1]
    local sync = lutra.dist.grad_sync(g, mine, { bucket_bytes = (HID * OUT + OUT) * 4 })
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
    -- finish is idempotent: a second one has nothing to wait for
    local before = g:stats().all_reduce
    sync:finish()
    assert.are.equal(before, g:stats().all_reduce)
    -- a sync never armed has nothing to finish: that is the caller's mistake
    local fresh = lutra.dist.grad_sync(g, mine)
    local ok, err = pcall(fresh.finish, fresh)
    assert.is_false(ok)
    assert.matches("lutra_grad_sync_finish: not armed", err)
  end)
end)

-- The optimizer step waits for the sync by itself (as a PyTorch optimizer over a DDP model's
-- parameters does): begin, backward, step is a whole data-parallel step, and an explicit finish
-- (twice: it is idempotent) changes nothing. Two steps on fresh batches, SGD with momentum or
-- AdamW, so the second step reads state the first left; the gradients and the parameters after
-- each step against one process stepping on the whole batch.
describe("dist data parallel: the optimizer step waits for the gradients", function()
  local w = D.world()
  local rank, n = w:rank(), w:size()
  local B = 4 * n

  local function optimizer(kind, m)
    if kind == "adamw" then return lutra.optim.AdamW(m, { lr = 1e-2 }) end
    return lutra.optim.SGD(m, { lr = 0.1, momentum = 0.9 })
  end

  for _, cfg in ipairs({ { dtype = "f32", tol = 1e-12 },
                         { dtype = "f32", optim = "adamw", tol = 1e-12 },
                         { dtype = "f32", main = true, tol = 1e-12 },
                         -- bf16 parameters: the optimizer steps f32 masters
                         { dtype = "bf16", tol = 1e-4 },
                         { dtype = "bf16", main = true, tol = 1e-4 } }) do
    for _, explicit in ipairs({ false, true }) do
      local what = string.format("%s%s, %s, %s", cfg.dtype,
                                 cfg.main and " with accumulate_main_grad" or "",
                                 cfg.optim or "sgd",
                                 explicit and "finish called twice before the step"
                                   or "no finish: the step waits")
      it(what .. ": two steps on half the batch each equal one rank on the whole", function()
        local dtype = cfg.dtype
        local whole, mine = net(cfg), net(cfg)
        local wopt = optimizer(cfg.optim, whole)
        -- made before the sync: the step finds the sync by the gradients it reads
        local opt = optimizer(cfg.optim, mine)
        local g = w:split(0, rank)
        local es = dtype == "f32" and 4 or 2
        local sync = lutra.dist.grad_sync(g, mine, { bucket_bytes = (IN * HID + HID) * es })
        for s = 1, 2 do
          local X = D.rank_data(B * IN, s, 71, dtype):reshape({ B, IN })
          local T = D.rank_data(B * OUT, s, 72, dtype):reshape({ B, OUT })
          if cfg.main then whole:zero_grad(); mine:zero_grad() end
          step(whole, nil, X, T)
          local want = grads(whole, cfg.main)
          wopt:step()

          local x = rows(X, IN, rank * 4, rank * 4 + 4, dtype)
          local t = rows(T, OUT, rank * 4, rank * 4 + 4, dtype)
          local loss = lutra.nn.MSELoss()
          loss:forward(mine:forward(x), t)
          sync:begin()
          local before = g:stats().all_reduce
          mine:backward(loss:backward(), false)
          if explicit then
            sync:finish()
            sync:finish()
          end
          opt:step()
          local buckets, _, early = sync:info()
          assert.are.equal(buckets, g:stats().all_reduce - before)
          assert.are.equal(buckets, early) -- every bucket started inside the backward
          close(grads(mine, cfg.main), want, cfg.tol, "gradient at step " .. s)
          close(values(mine), values(whole), cfg.tol, "parameter after step " .. s)
          sync:finish() -- nothing left to wait for: a no-op after the step's
        end
      end)
    end
  end

  it("an optimizer over part of the synced model waits for all of it; one over other "
     .. "parameters does not touch the sync", function()
    local g = w:split(0, rank)
    local x, t, want = my_rows_and_whole_grads(w, 73)
    local l1 = lutra.nn.Linear(IN, HID, { seed = 1 })
    local l2 = lutra.nn.Linear(HID, OUT, { seed = 2 })
    local mine = lutra.nn.Sequential(l1, lutra.nn.GELU(), l2)
    local sync = lutra.dist.grad_sync(g, mine, { bucket_bytes = (HID * OUT + OUT) * 4 })
    local other = lutra.nn.Linear(IN, OUT, { seed = 3 })
    other:forward(D.rank_data(4 * IN, rank, 75):reshape({ 4, IN }))
    other:backward(D.rank_data(4 * OUT, rank, 76):reshape({ 4, OUT }))
    local other_opt = lutra.optim.SGD(other, { lr = 0.1 })
    local loss = lutra.nn.MSELoss()
    loss:forward(mine:forward(x), t)
    sync:begin()
    mine:backward(loss:backward(), false)
    other_opt:step() -- reads none of the synced gradients: the sync stays armed
    local ok, err = pcall(sync.begin, sync)
    assert.is_false(ok)
    assert.matches("lutra_grad_sync_begin: already armed", err)
    local part = lutra.optim.SGD(l2, { lr = 0.1 }) -- made after the sync
    part:step()
    close(grads(mine), want, 1e-12, "gradient")
    sync:begin() -- disarmed by the step
    sync:finish()
  end)
end)

-- autocast{recipe = delayed, group = world} under mpirun: the amaxes every rank's quantizers
-- record are replaced by their max over the ranks in ONE all-reduce at the forward update and
-- one at the backward trigger, whatever the depth. The reference: each rank's data run through
-- a fresh copy of the model without a group (same weights), the per-rank amaxes maxed here.
local lutra = require("lutra")
local D = require("spec.dist.support")

local H, ROWS, HIST = 16, 16, 4

local function make(depth, seed)
  local layers = {}
  for i = 1, depth do layers[i] = lutra.nn.Linear(H, H, { seed = seed + i }) end
  return lutra.nn.Sequential(unpack(layers)), layers
end

local function data(rank, salt, n)
  return D.rank_data(n, rank, salt):reshape({ ROWS, H })
end

-- the last amax each quantizer recorded (the newest history slot after an update)
local function amaxes(layers)
  local t = {}
  for i, l in ipairs(layers) do
    for _, role in ipairs({ "input", "weight", "grad_output" }) do
      t[#t + 1] = { i, role, l:quantizer(role):history(HIST)[HIST] }
    end
  end
  return t
end

local function one_step(net, scope, x, dy)
  scope:enter()
  net:forward(x)
  scope:exit()
  net:backward(dy)
end

describe("dist amax reduction", function()
  local w = D.world()
  local rank, size = w:rank(), w:size()
  local recipe = lutra.recipe.delayed({ amax_history_len = HIST })

  for _, depth in ipairs({ 1, 4 }) do
    it(string.format("depth %d: the amaxes equal the max over ranks, one all-reduce forward and "
                     .. "one backward per step", depth), function()
      local g = w:split(0, rank) -- its own group, so only this spec's collectives are counted
      local net, layers = make(depth, 100 * depth)
      local scope = lutra.autocast({ recipe = recipe, group = g })
      local before = g:stats()
      one_step(net, scope, data(rank, 31, ROWS * H), data(rank, 41, ROWS * H))
      -- the reference: every rank's step-1 data alone through a fresh copy (the same weights
      -- and initial scales), the amaxes maxed over the ranks here
      local want
      for r = 0, size - 1 do
        local _, ref = make(depth, 100 * depth)
        local refnet = lutra.nn.Sequential(unpack(ref))
        one_step(refnet, lutra.autocast({ recipe = recipe }), data(r, 31, ROWS * H),
                 data(r, 41, ROWS * H))
        local a = amaxes(ref)
        if not want then want = a
        else for i = 1, #a do want[i][3] = math.max(want[i][3], a[i][3]) end end
      end
      local got = amaxes(layers)
      for i = 1, #got do
        assert.are.equal(want[i][3], got[i][3],
                         string.format("layer %d %s: %.9g vs %.9g", got[i][1], got[i][2],
                                       got[i][3], want[i][3]))
      end
      local steps = 4
      for step = 2, steps do
        one_step(net, scope, data(rank, 30 + step, ROWS * H), data(rank, 40 + step, ROWS * H))
      end
      local after = g:stats()
      assert.are.equal(2 * steps, after.amax_reduce - before.amax_reduce)
      assert.are.equal(2 * steps, after.all_reduce - before.all_reduce)
      assert.are.equal(0, after.all_gather + after.reduce_scatter)
      -- forward: input and weight metas of each layer; backward: grad_output
      assert.are.equal(steps * 3 * depth * 4, after.bytes - before.bytes)
    end)
  end
  it("Lua scaling rules read the amaxes reduced over the group (the all-reduce comes first)",
     function()
    -- a rule equal to the built-in max gives the built-in's scales and histories bit for bit;
    -- with a group, only when the rules are handed the reduced amaxes (each rank's data differ)
    local function lua_max(h, n)
      local m = 0
      for i = 0, n - 1 do if h[i] > m then m = h[i] end end
      return m
    end
    local ruled = lutra.recipe.delayed({ amax_history_len = HIST, amax_compute_algo = lua_max })
    local function trace(r)
      local g = w:split(0, rank)
      local net, layers = make(2, 700)
      local scope = lutra.autocast({ recipe = r, group = g })
      local out = {}
      for step = 1, 3 do
        one_step(net, scope, data(rank, 60 + step, ROWS * H), data(rank, 70 + step, ROWS * H))
        for i, l in ipairs(layers) do
          for _, role in ipairs({ "input", "weight", "grad_output" }) do
            local q = l:quantizer(role)
            out[#out + 1] = { step, i, role, q:scale(), q:history(HIST) }
          end
        end
      end
      return out
    end
    local want, got = trace(recipe), trace(ruled)
    for i = 1, #want do
      assert.are.same(want[i], got[i], string.format("step %d layer %d %s", want[i][1],
                                                     want[i][2], want[i][3]))
    end
  end)
  it("ranks with another recipe are named at the first reduction, and the scope is left", function()
    local g = w:split(0, rank)
    local mine = rank == size - 1 and lutra.recipe.delayed({ amax_history_len = HIST, margin = 1 })
                 or recipe
    local net = make(1, 500)
    local scope = lutra.autocast({ recipe = mine, group = g })
    local ok, err = pcall(scope.run, scope, function() net:forward(data(rank, 90, ROWS * H)) end)
    assert.is_false(ok)
    assert.matches("lutra_autocast_exit: ranks disagree on the forward amax reduction's "
                   .. "%(quantizers, device, recipe key%): rank 0 has %(2, 0, %d+%), rank "
                   .. (size - 1) .. " has %(2, 0, %d+%)", err)
    assert.are.equal(0, (lutra.autocast_state()))
    -- the same model and recipe everywhere works on that group afterwards
    local ok2 = pcall(scope.run, lutra.autocast({ recipe = recipe, group = g }), function()
      make(1, 501):forward(data(rank, 91, ROWS * H))
    end)
    assert.is_true(ok2)
  end)
end)

-- Tensor-parallel GroupedLinear under mpirun (every expert column- or row-parallel) against the
-- unsharded GroupedLinear run on the same tokens on every rank: forward, input gradient, every
-- expert's weight and bias gradients, each compared with the slice this rank holds. Bitwise for
-- the bias gradients (lutra's own column sums, in the same order); NMSE < 1e-12 for the GEMMs'
-- outputs: the all-reduce reassociates the sum over the split features (the column dgrad, the
-- row forward), and OpenBLAS's blocking, which depends on the GEMM's shape and the CPU, may order
-- the shard's sums otherwise (the column forward, the row dgrad, the wgrads: bitwise on some
-- CPUs, not on an AMD EPYC of 2026-12-02). Under delayed FP8 with the
-- amaxes reduced over the TP group every rank quantizes with the unsharded module's scales: the
-- same bounds hold.
local lutra = require("lutra")
local D = require("spec.dist.support")

local function block(v, cols, r0, r1, c0, c1)
  local out = {}
  for r = r0, r1 - 1 do
    for c = c0, c1 - 1 do out[#out + 1] = v[r * cols + c + 1] end
  end
  return out
end

local function from(vals, shape)
  local t = lutra.tensor(shape, "f32")
  t:set(vals)
  return t
end

local function same(got, want, bound, what)
  assert.are.equal(#want, #got, what .. ": sizes")
  if not bound then
    for i = 1, #want do
      if got[i] ~= want[i] then
        error(string.format("%s: element %d is %.9g, the unsharded module's %.9g", what, i, got[i],
                            want[i]))
      end
    end
  else
    local e = D.nmse(got, want)
    assert.is_true(e < bound, string.format("%s: nmse %g (bound %g)", what, e, bound))
  end
end

describe("dist tensor-parallel GroupedLinear", function()
  local w = D.world()
  local rank, n = w:rank(), w:size()
  local g = w:split(0, rank)
  local E = 3

  local cases = {
    { recipe = nil, IN = 8 * n, OUT = 4 * n, splits = { 3, 0, 5 } },
    -- FP8: each expert's rows padded to 16 inside the grouped quantization; GEMM dims of 16
    { recipe = function() return lutra.recipe.delayed({ amax_history_len = 4 }) end,
      IN = 16 * n, OUT = 16 * n, splits = { 16, 5, 27 }, amax_reductions = 2 },
    -- MXFP8: the shards hold whole 32-blocks (in / size and out / size multiples of 32), so each
    -- block's scale is the unsharded module's
    { recipe = function() return lutra.recipe.mxfp8() end, name = "MXFP8",
      IN = 32 * n, OUT = 32 * n, splits = { 32, 7, 41 }, amax_reductions = 0 },
  }
  for _, case in ipairs(cases) do
    for _, mode in ipairs({ "column", "row" }) do
      it(string.format("%s-parallel per expert equals the unsharded GroupedLinear (%s)", mode,
                       case.name or (case.recipe and "delayed FP8, amaxes over the TP group")
                       or "f32"), function()
        local IN, OUT, splits = case.IN, case.OUT, case.splits
        local R = 0
        for _, s in ipairs(splits) do R = R + s end
        local ref = lutra.nn.GroupedLinear(E, IN, OUT, { seed = 21 })
        local par = lutra.nn.GroupedLinear(E, IN, OUT, { parallel_mode = mode, tp_group = g,
                                                         seed = 22 })
        local rp, pp = ref:parameters(), par:parameters()
        local o0, o1, i0, i1 = 0, OUT, 0, IN
        if mode == "column" then o0, o1 = rank * OUT / n, (rank + 1) * OUT / n
        else i0, i1 = rank * IN / n, (rank + 1) * IN / n end
        local b0, b1 = mode == "column" and o0 or 0, mode == "column" and o1 or OUT
        for e = 1, E do
          pp[2 * e - 1].value:set(block(rp[2 * e - 1].value:to_table(), IN, o0, o1, i0, i1))
          pp[2 * e].value:set(block(rp[2 * e].value:to_table(), 1, b0, b1, 0, 1))
          pp[2 * e - 1].grad:fill(0 / 0)
          pp[2 * e].grad:fill(0 / 0)
        end
        local s_ref = case.recipe and lutra.autocast({ recipe = case.recipe() })
        local s_par = case.recipe and lutra.autocast({ recipe = case.recipe(), group = g })
        for step = 1, case.recipe and 3 or 1 do
          local X = D.rank_data(R * IN, 0, 130 + step):reshape({ R, IN })
          local dY = D.rank_data(R * OUT, 0, 135 + step):reshape({ R, OUT })
          if s_ref then s_ref:enter() end
          local y_ref = ref:forward(X, splits):to_table()
          if s_ref then s_ref:exit() end
          local dx_ref = ref:backward(dY):to_table()
          local x = mode == "row" and from(block(X:to_table(), IN, 0, R, i0, i1), { R, i1 - i0 })
                    or X
          local dy = mode == "column"
                     and from(block(dY:to_table(), OUT, 0, R, o0, o1), { R, o1 - o0 }) or dY
          local before = g:stats()
          if s_par then s_par:enter() end
          local y = par:forward(x, splits):to_table()
          if s_par then s_par:exit() end
          local dx = par:backward(dy):to_table()
          local after = g:stats()
          local what = string.format("step %d ", step)
          local col = mode == "column"
          -- the forward and the input gradient within NMSE 1e-12, not bitwise: OpenBLAS picks
          -- its kernel per CPU and its blocking by the GEMM's shape, so the shard's sums may be
          -- ordered otherwise; on some CPUs (an AMD EPYC of 2026-12-02) that reaches the FP8
          -- emulation's GEMMs and the row dgrad too, which other CPUs give bitwise
          same(y, block(y_ref, OUT, 0, R, o0, o1), 1e-12, what .. "y")
          same(dx, block(dx_ref, IN, 0, R, i0, i1), 1e-12, what .. "dx")
          for e = 1, E do
            same(pp[2 * e - 1].grad:to_table(),
                 block(rp[2 * e - 1].grad:to_table(), IN, o0, o1, i0, i1), 1e-12,
                 what .. "dW of expert " .. e)
            same(pp[2 * e].grad:to_table(), block(rp[2 * e].grad:to_table(), 1, b0, b1, 0, 1),
                 nil, what .. "dbias of expert " .. e)
          end
          if step > 1 then -- past the first calls' agreement checks
            -- one all-reduce of the grouped output (row) or of the input gradient (column), and
            -- under delayed scaling the forward's and the backward's amax reductions
            local amax = case.amax_reductions
            assert.are.equal(1 + amax, after.all_reduce - before.all_reduce, "all-reduces per step")
            assert.are.equal(amax, after.amax_reduce - before.amax_reduce, "amax reductions")
          end
        end
      end)
    end
  end

  it("collectives per step: one all-reduce, of the output (row) or the input gradient (column)",
     function()
    for _, mode in ipairs({ "column", "row" }) do
      local m = lutra.nn.GroupedLinear(E, 8 * n, 4 * n, { parallel_mode = mode, tp_group = g })
      local x = lutra.tensor({ 6, mode == "row" and 8 or 8 * n }, "f32")
      x:uniform(rank + 1, -1, 1)
      local splits = { 2, 1, 3 }
      local y = m:forward(x, splits)
      local dy = lutra.tensor({ 6, y:dims()[2] }, "f32")
      dy:fill(1)
      m:backward(dy)
      local mid = g:stats()
      m:forward(x, splits)
      local fwd = g:stats()
      m:backward(dy)
      local after = g:stats()
      assert.are.equal(mode == "row" and 1 or 0, fwd.all_reduce - mid.all_reduce, mode)
      assert.are.equal(mode == "column" and 1 or 0, after.all_reduce - fwd.all_reduce, mode)
      assert.are.equal(0, after.all_gather - mid.all_gather + after.reduce_scatter
                       - mid.reduce_scatter, mode)
    end
  end)

  it("refuses bad options with clear errors", function()
    local ok, err = pcall(lutra.nn.GroupedLinear, E, 8, 8, { tp_group = g })
    assert.is_false(ok)
    assert.matches("lutra.nn.GroupedLinear: parallel_mode must be \"column\" or \"row\"", err)
    ok, err = pcall(lutra.nn.GroupedLinear, E, 8, 8, { parallel_mode = "row" })
    assert.is_false(ok)
    assert.matches("tp_group must be a group", err)
    ok, err = pcall(lutra.nn.GroupedLinear, E, 8, 8, { parallel_mode = "column", tp_group = g,
                                                       sequence_parallel = true })
    assert.is_false(ok)
    assert.matches("lutra_grouped_linear_parallel_new: sequence parallelism is not supported", err)
    if n > 1 then
      ok, err = pcall(lutra.nn.GroupedLinear, E, 8 * n + 1, 8, { parallel_mode = "row",
                                                                 tp_group = g })
      assert.is_false(ok)
      assert.matches("in_features " .. (8 * n + 1) .. " is not a multiple of the group size", err)
      ok, err = pcall(lutra.nn.GroupedLinear, E, 8, 8 * n + 1, { parallel_mode = "column",
                                                                 tp_group = g })
      assert.is_false(ok)
      assert.matches("out_features " .. (8 * n + 1) .. " is not a multiple of the group size", err)
    end
  end)
end)

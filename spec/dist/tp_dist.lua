-- Tensor-parallel Linear under mpirun (column / row, with and without sequence parallelism,
-- f32 on the CPU backend) against the unsharded Linear run on the gathered data on every rank:
-- forward output, input gradient, weight and bias gradients, each compared with the slice this
-- rank holds. Bitwise where the shard computes the same sums in the same order (the column
-- forward and wgrad, the row dgrad: the reduction dim is not split), NMSE < 1e-12 where the sum
-- over the split dim is reassociated by the collective.
local lutra = require("lutra")
local D = require("spec.dist.support")

local function mat(t, rows, cols)
  local v = t:to_table()
  assert(#v == rows * cols)
  return v
end

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

-- bitwise only where both sides ran the same computation at the same shapes, or a reduction lutra
-- does itself in a fixed order (the bias gradient's f64 column sums): a GEMM of a shard against
-- the unsharded GEMM is within NMSE 1e-12, because OpenBLAS picks its kernels by the matrix
-- shape and some of them sum in another order (seen with 0.3.21's Zen kernels on an AMD EPYC:
-- a column shard's y differed from the unsharded y in its last bits)
local function same(got, want, bitwise, what)
  assert.are.equal(#want, #got, what .. ": sizes")
  if bitwise then
    for i = 1, #want do
      if got[i] ~= want[i] then
        error(string.format("%s: element %d is %.9g, the unsharded module's %.9g", what, i, got[i],
                            want[i]))
      end
    end
  else
    local e = D.nmse(got, want)
    assert.is_true(e < 1e-12, string.format("%s: nmse %g", what, e))
  end
end

describe("dist tensor-parallel Linear", function()
  local w = D.world()
  local rank, n = w:rank(), w:size()
  local IN, OUT, R = 8 * n, 4 * n, 4 * n

  for _, mode in ipairs({ "column", "row" }) do
    for _, sp in ipairs({ false, true }) do
      it(string.format("%s-parallel%s equals the unsharded Linear", mode,
                       sp and " with sequence parallelism" or ""), function()
        local ref = lutra.nn.Linear(IN, OUT, { seed = 77 })
        local X = D.rank_data(R * IN, 0, 51):reshape({ R, IN }) -- the same on every rank
        local dY = D.rank_data(R * OUT, 0, 52):reshape({ R, OUT })
        local y_ref = mat(ref:forward(X), R, OUT)
        local dx_ref = mat(ref:backward(dY), R, IN)
        local rp = ref:parameters()
        local W, B = mat(rp[1].value, OUT, IN), rp[2].value:to_table()
        local dW, dB = mat(rp[1].grad, OUT, IN), rp[2].grad:to_table()

        local par = lutra.nn.Linear(IN, OUT, { parallel_mode = mode, tp_group = w,
                                               sequence_parallel = sp, seed = 5 })
        local pp = par:parameters()
        local o0, o1, i0, i1 = 0, OUT, 0, IN -- this rank's slice of W
        if mode == "column" then o0, o1 = rank * OUT / n, (rank + 1) * OUT / n
        else i0, i1 = rank * IN / n, (rank + 1) * IN / n end
        pp[1].value:set(block(W, IN, o0, o1, i0, i1))
        local b0, b1 = mode == "column" and o0 or 0, mode == "column" and o1 or OUT
        local bvals = {}
        for i = b0 + 1, b1 do bvals[#bvals + 1] = B[i] end
        pp[2].value:set(bvals)

        local s0, s1 = rank * R / n, (rank + 1) * R / n -- this rank's rows of the sequence
        local x, dy
        if mode == "column" then
          x = sp and from(block(mat(X, R, IN), IN, s0, s1, 0, IN), { R / n, IN }) or X
          dy = from(block(mat(dY, R, OUT), OUT, 0, R, o0, o1), { R, o1 - o0 })
        else
          x = from(block(mat(X, R, IN), IN, 0, R, i0, i1), { R, i1 - i0 })
          dy = sp and from(block(mat(dY, R, OUT), OUT, s0, s1, 0, OUT), { R / n, OUT }) or dY
        end
        local y = par:forward(x)
        local dx = par:backward(dy)
        local col = mode == "column"
        if col then
          same(y:to_table(), block(y_ref, OUT, 0, R, o0, o1), false, "y")
          local dxw = sp and block(dx_ref, IN, s0, s1, 0, IN) or dx_ref
          same(dx:to_table(), dxw, false, "dx")
        else
          same(y:to_table(), sp and block(y_ref, OUT, s0, s1, 0, OUT) or y_ref, false, "y")
          same(dx:to_table(), block(dx_ref, IN, 0, R, i0, i1), false, "dx")
        end
        same(pp[1].grad:to_table(), block(dW, IN, o0, o1, i0, i1), false, "dW")
        local dbw = {}
        for i = b0 + 1, b1 do dbw[#dbw + 1] = dB[i] end
        same(pp[2].grad:to_table(), dbw, true, "dbias")
      end)
    end
  end

  it("column + SP under delayed FP8 gathers FP8 codes (one byte per element) and equals the "
     .. "column layer on the gathered input", function()
    local g = w:split(0, rank) -- the TP group, also the autocast's (its amaxes are reduced there)
    local r = lutra.recipe.delayed({ amax_history_len = 4 })
    local IN2, OUT2, R2 = 16, 16 * n, 16 * n -- FP8 GEMMs take multiples of 16
    local sp = lutra.nn.Linear(IN2, OUT2, { parallel_mode = "column", tp_group = g,
                                            sequence_parallel = true, seed = 8 })
    local plain = lutra.nn.Linear(IN2, OUT2, { parallel_mode = "column", tp_group = g, seed = 8 })
    local s1, s2 = lutra.autocast({ recipe = r, group = g }), lutra.autocast({ recipe = r, group = g })
    local s0, s1_ = rank * R2 / n, (rank + 1) * R2 / n
    for step = 1, 3 do
      local X = D.rank_data(R2 * IN2, 0, 70 + step):reshape({ R2, IN2 })
      local x = from(block(mat(X, R2, IN2), IN2, s0, s1_, 0, IN2), { R2 / n, IN2 })
      local dY = D.rank_data(R2 * OUT2 / n, rank, 80 + step):reshape({ R2, OUT2 / n })
      local before = g:stats()
      s1:enter()
      local y = sp:forward(x)
      s1:exit()
      local mid = g:stats()
      local dx = sp:backward(dY)
      s2:enter()
      local y_ref = plain:forward(X)
      s2:exit()
      local dx_ref = plain:backward(dY)
      same(y:to_table(), y_ref:to_table(), true, "step " .. step .. " y")
      same(dx:to_table(), block(mat(dx_ref, R2, IN2), IN2, s0, s1_, 0, IN2), false,
           "step " .. step .. " dx")
      same(sp:parameters()[1].grad:to_table(), plain:parameters()[1].grad:to_table(), true,
           "step " .. step .. " dW")
      assert.are.equal(1, mid.all_gather - before.all_gather)
      if step > 1 then -- past the first call's agreement check: the FP8 codes only
        assert.are.equal(R2 / n * IN2 + 2 * 4 * 1, mid.bytes - before.bytes) -- + 2 amaxes
      end
    end
  end)

  it("collectives per forward and backward are TE's", function()
    local g = w:split(0, rank)
    local counts = {}
    for _, cfg in ipairs({ { "column", false }, { "column", true }, { "row", false },
                           { "row", true } }) do
      local m = lutra.nn.Linear(IN, OUT, { parallel_mode = cfg[1], tp_group = g,
                                           sequence_parallel = cfg[2] })
      local x = lutra.tensor({ (cfg[1] == "column" and cfg[2]) and R / n or R,
                               cfg[1] == "row" and IN / n or IN }, "f32")
      x:uniform(rank, -1, 1)
      local before = g:stats()
      local y = m:forward(x)
      local dy = lutra.tensor({ y:dims()[1], y:dims()[2] }, "f32")
      dy:fill(1)
      m:backward(dy)
      -- the second step: no agreement check any more, only the layer's own collectives
      local mid = g:stats()
      m:forward(x)
      m:backward(dy)
      local after = g:stats()
      counts[#counts + 1] = string.format("%s%s ar=%d ag=%d rs=%d", cfg[1], cfg[2] and "+sp" or "",
        after.all_reduce - mid.all_reduce, after.all_gather - mid.all_gather,
        after.reduce_scatter - mid.reduce_scatter)
      assert.is_truthy(before)
    end
    assert.are.same({ "column ar=1 ag=0 rs=0", "column+sp ar=0 ag=1 rs=1",
                      "row ar=1 ag=0 rs=0", "row+sp ar=0 ag=1 rs=1" }, counts)
  end)

  it("ranks that disagree on the input shape are named at the first call", function()
    local m = lutra.nn.Linear(IN, OUT, { parallel_mode = "column", tp_group = w })
    local x = lutra.tensor({ rank == n - 1 and R + 1 or R, IN }, "f32")
    x:fill(1)
    local ok, err = pcall(m.forward, m, x)
    assert.is_false(ok)
    assert.matches("lutra_linear_parallel_forward: ranks disagree on the parallel layer's", err)
    assert.matches("rank 0 has %(" .. R .. ", " .. IN, err)
    assert.matches("rank " .. (n - 1) .. " has %(" .. (R + 1), err)
  end)

  it("refuses a feature count the group does not divide, and bad options", function()
    local ok, err = pcall(lutra.nn.Linear, IN, OUT + 1, { parallel_mode = "column", tp_group = w })
    if n > 1 then
      assert.is_false(ok)
      assert.matches("out_features " .. (OUT + 1) .. " is not a multiple of the group size", err)
    end
    ok, err = pcall(lutra.nn.Linear, IN, OUT, { parallel_mode = "diagonal", tp_group = w })
    assert.is_false(ok)
    assert.matches("parallel_mode must be \"column\" or \"row\"", err)
    ok, err = pcall(lutra.nn.Linear, IN, OUT, { parallel_mode = "row" })
    assert.is_false(ok)
    assert.matches("tp_group must be a group", err)
  end)
end)

-- Tensor-parallel LayerNormLinear (column) and LayerNormMLP (FC1 column, FC2 row) under mpirun
-- against the unsharded module run on the gathered data on every rank (the same data and
-- weights everywhere), forward and backward, each rank's outputs and gradients compared with the
-- slice it holds. Bitwise where the shard computes the same sums in the same order (column
-- GEMMs, wgrads, the bias gradients, FC1 and the activation: their reduction dims are not split);
-- NMSE where a collective reassociates a sum over the split dim (column dgrads, FC2's output, the
-- norm's gradients), bound stated per check. FP8: delayed scaling with the amaxes reduced over
-- the TP group and MXFP8 (32-aligned shards) quantize with the unsharded module's scales, so the
-- same bounds hold against it; current scaling's weight scales are the shard's (as TE's), so SP
-- under current scaling is checked against the same shard without SP.
local lutra = require("lutra")
local D = require("spec.dist.support")

local function block(v, cols, r0, r1, c0, c1)
  local out = {}
  for r = r0, r1 - 1 do
    for c = c0, c1 - 1 do out[#out + 1] = v[r * cols + c + 1] end
  end
  return out
end

local function range(v, i0, i1)
  local out = {}
  for i = i0 + 1, i1 do out[#out + 1] = v[i] end
  return out
end

local function concat(a, b)
  local out = {}
  for _, x in ipairs(a) do out[#out + 1] = x end
  for _, x in ipairs(b) do out[#out + 1] = x end
  return out
end

local function from(vals, shape)
  local t = lutra.tensor(shape, "f32")
  t:set(vals)
  return t
end

-- bound nil: bitwise, only where both sides ran the same computation at the same shapes; a GEMM
-- of a shard against the unsharded GEMM is within NMSE 1e-12, because OpenBLAS picks its kernels
-- by the matrix shape and some of them sum in another order (0.3.21's Zen kernels on an AMD EPYC:
-- a column shard's y and dW differed from the unsharded module's in their last bits)
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

-- the sum over the group of a gradient each rank holds a part of (sequence-parallel norms)
local function summed(g, t)
  local v = t:to_table()
  local c = from(v, { #v })
  return g:all_reduce(c):to_table()
end

local function poison(t) t:fill(0 / 0) end

describe("dist tensor-parallel LayerNormLinear and LayerNormMLP", function()
  local w = D.world()
  local rank, n = w:rank(), w:size()
  local g = w:split(0, rank)

  -- one step of ref (unsharded, on X / dY) and par (sharded, on this rank's x / dy), inside the
  -- scopes given (nil: none): y, dx of each
  local function step(ref, par, X, dY, x, dy, s_ref, s_par)
    if s_ref then s_ref:enter() end
    local y_ref = ref:forward(X):to_table()
    if s_ref then s_ref:exit() end
    local dx_ref = ref:backward(dY):to_table()
    if s_par then s_par:enter() end
    local y = par:forward(x):to_table()
    if s_par then s_par:exit() end
    local dx = par:backward(dy):to_table()
    return y_ref, dx_ref, y, dx
  end

  -- LayerNormLinear: norm weight, norm bias, W, b; this rank's column shard set from ref's
  local function lnl_pair(IN, OUT, sp, seed)
    local ref = lutra.nn.LayerNormLinear(IN, OUT, { seed = seed })
    local par = lutra.nn.LayerNormLinear(IN, OUT, { parallel_mode = "column", tp_group = g,
                                                    sequence_parallel = sp, seed = seed + 1 })
    local rp, pp = ref:parameters(), par:parameters()
    -- different gamma/beta than the defaults, so their gradients' placement matters
    rp[1].value:uniform(seed + 2, 0.5, 1.5)
    rp[2].value:uniform(seed + 3, -0.5, 0.5)
    local o0, o1 = rank * OUT / n, (rank + 1) * OUT / n
    pp[1].value:set(rp[1].value:to_table())
    pp[2].value:set(rp[2].value:to_table())
    pp[3].value:set(block(rp[3].value:to_table(), IN, o0, o1, 0, IN))
    pp[4].value:set(range(rp[4].value:to_table(), o0, o1))
    for _, p in ipairs(pp) do poison(p.grad) end
    return ref, par, o0, o1
  end

  local function check_lnl(ref, par, IN, OUT, R, sp, o0, o1, X, dY, s_ref, s_par, tol, what)
    local s0, s1 = rank * R / n, (rank + 1) * R / n
    local x = sp and from(block(X:to_table(), IN, s0, s1, 0, IN), { R / n, IN }) or X
    local dy = from(block(dY:to_table(), OUT, 0, R, o0, o1), { R, o1 - o0 })
    local y_ref, dx_ref, y, dx = step(ref, par, X, dY, x, dy, s_ref, s_par)
    same(y, block(y_ref, OUT, 0, R, o0, o1), tol.y, what .. " y")
    same(dx, sp and block(dx_ref, IN, s0, s1, 0, IN) or dx_ref, tol.dx, what .. " dx")
    local rp, pp = ref:parameters(), par:parameters()
    same(pp[3].grad:to_table(), block(rp[3].grad:to_table(), IN, o0, o1, 0, IN), tol.dw,
         what .. " dW")
    same(pp[4].grad:to_table(), range(rp[4].grad:to_table(), o0, o1), tol.dw, what .. " dbias")
    for i = 1, 2 do
      local got = sp and summed(g, pp[i].grad) or pp[i].grad:to_table()
      same(got, rp[i].grad:to_table(), tol.dnorm, what .. (i == 1 and " dgamma" or " dbeta"))
    end
  end

  for _, sp in ipairs({ false, true }) do
    it(string.format("LayerNormLinear column-parallel%s equals the unsharded module (f32)",
                     sp and " with sequence parallelism" or ""), function()
      local IN, OUT, R = 8 * n, 4 * n, 4 * n
      local ref, par, o0, o1 = lnl_pair(IN, OUT, sp, 31)
      local X = D.rank_data(R * IN, 0, 61):reshape({ R, IN })
      local dY = D.rank_data(R * OUT, 0, 62):reshape({ R, OUT })
      -- dx: the dgrad's sum over the output features is split over the ranks, then summed by
      -- the collective; the norm's gradients read that dx (and, with SP, are summed over ranks)
      check_lnl(ref, par, IN, OUT, R, sp, o0, o1, X, dY, nil, nil,
                { y = 1e-12, dx = 1e-12, dw = 1e-12, dnorm = 1e-12 }, "f32")
    end)
  end

  local fp8 = {
    { name = "delayed scaling, amaxes reduced over the TP group",
      recipe = function() return lutra.recipe.delayed({ amax_history_len = 4 }) end,
      norm_writes_codes = true },
    -- gathered in high precision, then quantized (each block's scale needs its own rows)
    { name = "MXFP8", recipe = function() return lutra.recipe.mxfp8() end,
      norm_writes_codes = false },
  }
  for _, case in ipairs(fp8) do
    it("LayerNormLinear column + SP under " .. case.name .. " equals the unsharded module over 3 "
       .. "steps", function()
      local IN, OUT, R = 64, 32 * n, 32 * n -- FP8 GEMMs take multiples of 16, MXFP8 blocks 32
      local ref, par, o0, o1 = lnl_pair(IN, OUT, true, 41)
      local r = case.recipe()
      local s_ref = lutra.autocast({ recipe = r })
      local s_par = lutra.autocast({ recipe = r, group = g })
      for k = 1, 3 do
        local X = D.rank_data(R * IN, 0, 90 + k):reshape({ R, IN })
        local dY = D.rank_data(R * OUT, 0, 95 + k):reshape({ R, OUT })
        local before = g:stats()
        -- every rank's scales are the unsharded module's (the amaxes are the global maxima), so
        -- the codes are the same and every output equals the unsharded one up to the order of
        -- its f32 sums (the dgrad's reassociated by the collective, the GEMMs' by OpenBLAS)
        check_lnl(ref, par, IN, OUT, R, true, o0, o1, X, dY, s_ref, s_par,
                  { y = 1e-12, dx = 1e-12, dw = 1e-12, dnorm = 1e-12 }, "step " .. k)
        local after = g:stats()
        assert.are.equal(1, after.all_gather - before.all_gather, "one gather per step")
        assert.are.equal(1, after.reduce_scatter - before.reduce_scatter,
                         "one reduce-scatter per step")
      end
      assert.are.equal(case.norm_writes_codes, par:norm_fused(), "the norm wrote the FP8 codes")
    end)
  end

  it("LayerNormLinear column + SP under current scaling gathers in high precision and equals the "
     .. "column layer on the gathered input", function()
    -- current scaling's weight amax is the shard's (as TE's), so the reference is the same shard
    -- without SP on the whole sequence; the input's amax is then over the gathered rows in both
    local IN, OUT, R = 32, 16 * n, 16 * n
    local sp = lutra.nn.LayerNormLinear(IN, OUT, { parallel_mode = "column", tp_group = g,
                                                   sequence_parallel = true, seed = 12 })
    local plain = lutra.nn.LayerNormLinear(IN, OUT, { parallel_mode = "column", tp_group = g,
                                                      seed = 12 })
    local s1 = lutra.autocast({ recipe = lutra.recipe.current(), group = g })
    local s2 = lutra.autocast({ recipe = lutra.recipe.current(), group = g })
    local s0, s1_ = rank * R / n, (rank + 1) * R / n
    for k = 1, 2 do
      local X = D.rank_data(R * IN, 0, 140 + k):reshape({ R, IN })
      local x = from(block(X:to_table(), IN, s0, s1_, 0, IN), { R / n, IN })
      local dY = D.rank_data(R * OUT / n, rank, 145 + k):reshape({ R, OUT / n })
      local before = g:stats()
      s1:enter()
      local y = sp:forward(x):to_table()
      s1:exit()
      local mid = g:stats()
      local dx = sp:backward(dY):to_table()
      s2:enter()
      local y_ref = plain:forward(X):to_table()
      s2:exit()
      local dx_ref = plain:backward(dY):to_table()
      same(y, y_ref, nil, "step " .. k .. " y")
      same(dx, block(dx_ref, IN, s0, s1_, 0, IN), 1e-12, "step " .. k .. " dx")
      for i, p in ipairs(sp:parameters()) do
        local got = i <= 2 and summed(g, p.grad) or p.grad:to_table()
        same(got, plain:parameters()[i].grad:to_table(), i <= 2 and 1e-12 or nil,
             "step " .. k .. " gradient " .. i)
      end
      assert.are.equal(1, mid.all_gather - before.all_gather)
      if k == 2 then -- past the agreement checks: the forward moved the f32 norm output only
        assert.are.equal(R / n * IN * 4, mid.bytes - before.bytes)
      end
    end
    assert.is_false(sp:norm_fused(), "the norm cannot write codes quantized after the gather")
  end)

  it("LayerNormLinear column + SP under delayed FP8 gathers the norm's FP8 codes (one byte per "
     .. "element)", function()
    local IN, OUT, R = 32, 16 * n, 16 * n
    local par = lutra.nn.LayerNormLinear(IN, OUT, { parallel_mode = "column", tp_group = g,
                                                    sequence_parallel = true, seed = 3 })
    local s = lutra.autocast({ recipe = lutra.recipe.delayed({ amax_history_len = 4 }), group = g })
    local x = D.rank_data(R / n * IN, rank, 7):reshape({ R / n, IN })
    local dy = lutra.tensor({ R, OUT / n }, "f32")
    dy:fill(1)
    for k = 1, 2 do
      local before = g:stats()
      s:enter()
      par:forward(x)
      s:exit()
      local mid = g:stats()
      par:backward(dy)
      assert.are.equal(1, mid.all_gather - before.all_gather)
      if k == 2 then -- past the first call's agreement check: the codes and the 2 amaxes
        assert.are.equal(R / n * IN + 2 * 4, mid.bytes - before.bytes)
      end
    end
    assert.is_true(par:norm_fused())
  end)

  -- LayerNormMLP: gamma, beta, W1, b1, W2, b2; FC1's shard is the gate rows and the linear rows
  -- of this rank's block (gated), FC2's the matching input features
  local function mlp_pair(H, F, act, sp, seed)
    local gated = act == "swiglu" or act == "geglu" or act == "reglu"
    local ref = lutra.nn.LayerNormMLP(H, F, { activation = act, seed = seed })
    local par = lutra.nn.LayerNormMLP(H, F, { activation = act, tp_group = g,
                                              sequence_parallel = sp, seed = seed + 1 })
    local rp, pp = ref:parameters(), par:parameters()
    rp[1].value:uniform(seed + 2, 0.5, 1.5)
    rp[2].value:uniform(seed + 3, -0.5, 0.5)
    local f0, f1 = rank * F / n, (rank + 1) * F / n
    local W1, b1 = rp[3].value:to_table(), rp[4].value:to_table()
    local function fc1(v, cols)
      local part = block(v, cols, f0, f1, 0, cols)
      if gated then part = concat(part, block(v, cols, F + f0, F + f1, 0, cols)) end
      return part
    end
    pp[1].value:set(rp[1].value:to_table())
    pp[2].value:set(rp[2].value:to_table())
    pp[3].value:set(fc1(W1, H))
    pp[4].value:set(fc1(b1, 1))
    pp[5].value:set(block(rp[5].value:to_table(), F, 0, H, f0, f1))
    pp[6].value:set(rp[6].value:to_table())
    for _, p in ipairs(pp) do poison(p.grad) end
    return ref, par, fc1, f0, f1
  end

  local function check_mlp(ref, par, H, F, R, sp, fc1, f0, f1, X, dY, s_ref, s_par, tol, what)
    local s0, s1 = rank * R / n, (rank + 1) * R / n
    local x = sp and from(block(X:to_table(), H, s0, s1, 0, H), { R / n, H }) or X
    local dy = sp and from(block(dY:to_table(), H, s0, s1, 0, H), { R / n, H }) or dY
    local y_ref, dx_ref, y, dx = step(ref, par, X, dY, x, dy, s_ref, s_par)
    same(y, sp and block(y_ref, H, s0, s1, 0, H) or y_ref, tol.y, what .. " y")
    same(dx, sp and block(dx_ref, H, s0, s1, 0, H) or dx_ref, tol.dx, what .. " dx")
    local rp, pp = ref:parameters(), par:parameters()
    same(pp[3].grad:to_table(), fc1(rp[3].grad:to_table(), H), tol.dw, what .. " dW1")
    same(pp[4].grad:to_table(), fc1(rp[4].grad:to_table(), 1), tol.dw, what .. " db1")
    same(pp[5].grad:to_table(), block(rp[5].grad:to_table(), F, 0, H, f0, f1), tol.dw,
         what .. " dW2")
    same(pp[6].grad:to_table(), rp[6].grad:to_table(), tol.dw, what .. " db2")
    for i = 1, 2 do
      local got = sp and summed(g, pp[i].grad) or pp[i].grad:to_table()
      same(got, rp[i].grad:to_table(), tol.dnorm, what .. (i == 1 and " dgamma" or " dbeta"))
    end
  end

  for _, act in ipairs({ "gelu", "swiglu" }) do
    for _, sp in ipairs({ false, true }) do
      it(string.format("LayerNormMLP (%s)%s equals the unsharded module (f32)", act,
                       sp and " with sequence parallelism" or ""), function()
        local H, F, R = 8 * n, 4 * n, 4 * n
        local ref, par, fc1, f0, f1 = mlp_pair(H, F, act, sp, 51)
        local X = D.rank_data(R * H, 0, 63):reshape({ R, H })
        local dY = D.rank_data(R * H, 0, 64):reshape({ R, H })
        -- FC2's output sums over the ffn features the ranks split (its all-reduce); the rest are
        -- the unsharded module's GEMMs on shards (within NMSE: see same)
        check_mlp(ref, par, H, F, R, sp, fc1, f0, f1, X, dY, nil, nil,
                  { y = 1e-12, dx = 1e-12, dw = 1e-12, dnorm = 1e-12 }, act)
      end)
    end
  end

  it("LayerNormMLP + SP under delayed FP8 (amaxes over the TP group) equals the unsharded module "
     .. "over 3 steps", function()
    local H, F, R = 64, 32 * n, 32 * n
    local ref, par, fc1, f0, f1 = mlp_pair(H, F, "gelu", true, 71)
    local r = lutra.recipe.delayed({ amax_history_len = 4 })
    local s_ref = lutra.autocast({ recipe = r })
    local s_par = lutra.autocast({ recipe = r, group = g })
    for k = 1, 3 do
      local X = D.rank_data(R * H, 0, 110 + k):reshape({ R, H })
      local dY = D.rank_data(R * H, 0, 115 + k):reshape({ R, H })
      -- the same scales as the unsharded module (global amaxes), the same FC1 codes; FC2's
      -- output and the input gradient are reassociated f32 sums of the same products
      check_mlp(ref, par, H, F, R, true, fc1, f0, f1, X, dY, s_ref, s_par,
                { y = 1e-12, dx = 1e-12, dw = 1e-12, dnorm = 1e-12 }, "step " .. k)
    end
  end)

  it("collectives per step are TE's", function()
    local counts = {}
    local H, F, R = 8 * n, 4 * n, 4 * n
    for _, cfg in ipairs({ { "lnl", false }, { "lnl", true }, { "mlp", false }, { "mlp", true } }) do
      local m = cfg[1] == "lnl"
        and lutra.nn.LayerNormLinear(H, F, { parallel_mode = "column", tp_group = g,
                                             sequence_parallel = cfg[2] })
        or lutra.nn.LayerNormMLP(H, F, { tp_group = g, sequence_parallel = cfg[2] })
      local x = lutra.tensor({ cfg[2] and R / n or R, H }, "f32")
      x:uniform(rank, -1, 1)
      local y = m:forward(x)
      local dy = lutra.tensor({ y:dims()[1], y:dims()[2] }, "f32")
      dy:fill(1)
      m:backward(dy)
      local mid = g:stats() -- the second step: past the agreement checks
      m:forward(x)
      m:backward(dy)
      local after = g:stats()
      counts[#counts + 1] = string.format("%s%s ar=%d ag=%d rs=%d", cfg[1], cfg[2] and "+sp" or "",
        after.all_reduce - mid.all_reduce, after.all_gather - mid.all_gather,
        after.reduce_scatter - mid.reduce_scatter)
    end
    assert.are.same({ "lnl ar=1 ag=0 rs=0", "lnl+sp ar=0 ag=1 rs=1",
                      "mlp ar=2 ag=0 rs=0", "mlp+sp ar=0 ag=2 rs=2" }, counts)
  end)

  it("refuses bad options with clear errors", function()
    local ok, err = pcall(lutra.nn.LayerNormLinear, 8 * n, 4 * n, { parallel_mode = "row",
                                                                    tp_group = g })
    assert.is_false(ok)
    assert.matches("lutra_layernorm_linear_parallel_new: row%-parallel is not supported "
                   .. "%(TransformerEngine refuses it too%): its input would be a shard of the "
                   .. "features, and the norm over the full hidden needs every feature of a row",
                   err)
    -- as TE: whatever the group size (one rank too), the norm and sequence parallelism
    for _, opts in ipairs({ { parallel_mode = "row", tp_group = w:split(rank, 0) },
                            { parallel_mode = "row" },
                            { parallel_mode = "row", tp_group = g, sequence_parallel = true },
                            { parallel_mode = "row", tp_group = g, normalization = "RMSNorm" } }) do
      ok, err = pcall(lutra.nn.LayerNormLinear, 8 * n, 4 * n, opts)
      assert.is_false(ok)
      assert.matches("lutra_layernorm_linear_parallel_new: row%-parallel is not supported", err)
    end
    ok, err = pcall(lutra.nn.LayerNormLinear, 8 * n, 4 * n, { tp_group = g })
    assert.is_false(ok)
    assert.matches("lutra.nn.LayerNormLinear: parallel_mode must be \"column\" or \"row\"", err)
    ok, err = pcall(lutra.nn.LayerNormLinear, 8 * n, 4 * n, { parallel_mode = "column" })
    assert.is_false(ok)
    assert.matches("tp_group must be a group", err)
    ok, err = pcall(lutra.nn.LayerNormMLP, 8 * n, 4 * n, { sequence_parallel = true })
    assert.is_false(ok)
    assert.matches("lutra.nn.LayerNormMLP: tp_group must be a group", err)
    ok, err = pcall(lutra.nn.LayerNormMLP, 8 * n, 4 * n, { parallel_mode = "column", tp_group = g })
    assert.is_false(ok)
    assert.matches("parallel_mode is not an option", err)
    if n > 1 then
      ok, err = pcall(lutra.nn.LayerNormLinear, 8, 4 * n + 1, { parallel_mode = "column",
                                                                tp_group = g })
      assert.is_false(ok)
      assert.matches("out_features " .. (4 * n + 1) .. " is not a multiple of the group size", err)
      ok, err = pcall(lutra.nn.LayerNormMLP, 8, 4 * n + 1, { activation = "swiglu", tp_group = g })
      assert.is_false(ok)
      assert.matches("lutra_layernorm_mlp_parallel_new: ffn_hidden " .. (4 * n + 1)
                     .. " is not a multiple of the group size", err)
      -- ranks that disagree on the input shape are named at the first call
      local m = lutra.nn.LayerNormLinear(8, 4 * n, { parallel_mode = "column", tp_group = g })
      local x = lutra.tensor({ rank == n - 1 and 5 or 4, 8 }, "f32")
      x:fill(1)
      ok, err = pcall(m.forward, m, x)
      assert.is_false(ok)
      assert.matches("lutra_layernorm_linear_forward: ranks disagree", err)
    end
  end)
  it("the C constructors refuse bad descs, naming the call, and make nothing", function()
    local ffi, C = require("ffi"), lutra.C
    local box = ffi.new("lutra_module*[1]")
    local function c_fails(fn, pat, st)
      assert.are.equal(C.LUTRA_EINVAL, st, fn .. ": status")
      local msg = ffi.string(C.lutra_last_error())
      assert.is_truthy(msg:find(fn, 1, true), msg)
      assert.is_truthy(msg:find(pat, 1, true), msg)
      assert.is_true(box[0] == nil, fn .. " made a module")
    end
    local d = ffi.new("lutra_layernorm_linear_desc")
    C.lutra_layernorm_linear_defaults(d)
    d.in_features, d.out_features = 8, 4 * n
    local t = ffi.new("lutra_tp_desc")
    box[0] = nil
    c_fails("lutra_layernorm_linear_parallel_new", "tp desc is NULL",
            C.lutra_layernorm_linear_parallel_new(d, nil, box))
    t.mode, t.group = 7, g
    c_fails("lutra_layernorm_linear_parallel_new", "parallel mode must be column",
            C.lutra_layernorm_linear_parallel_new(d, t, box))
    t.mode, t.group = C.LUTRA_TP_COLUMN, nil
    assert.are_not.equal(0, C.lutra_layernorm_linear_parallel_new(d, t, box))
    assert.is_true(box[0] == nil)
    local md = ffi.new("lutra_layernorm_mlp_desc")
    C.lutra_layernorm_mlp_defaults(md)
    md.hidden, md.ffn_hidden = 8, 4 * n
    t.mode, t.group = C.LUTRA_TP_COLUMN, g
    c_fails("lutra_layernorm_mlp_parallel_new", "the parallel mode must be LUTRA_TP_NONE",
            C.lutra_layernorm_mlp_parallel_new(md, t, box))
    c_fails("lutra_layernorm_mlp_parallel_new", "tp desc is NULL",
            C.lutra_layernorm_mlp_parallel_new(md, nil, box))
    local gd = ffi.new("lutra_grouped_linear_desc")
    C.lutra_grouped_linear_defaults(gd)
    gd.num_gemms, gd.in_features, gd.out_features = 2, 8, 4 * n
    c_fails("lutra_grouped_linear_parallel_new", "tp desc is NULL",
            C.lutra_grouped_linear_parallel_new(gd, nil, box))
    t.mode, t.sequence_parallel = C.LUTRA_TP_ROW, 1
    c_fails("lutra_grouped_linear_parallel_new", "sequence parallelism is not supported",
            C.lutra_grouped_linear_parallel_new(gd, t, box))
  end)
end)

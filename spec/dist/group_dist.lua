-- Process groups under mpirun (spec/dist_spec.lua launches this on 2 and 4 ranks, CPU backend):
-- collectives against the values every rank can recompute from the others' seeds.
local lutra = require("lutra")
local D = require("spec.dist.support")

describe("dist groups", function()
  local w = D.world()
  local rank, size = w:rank(), w:size()

  it("world rank and size are mpirun's", function()
    assert.are.equal(tonumber(os.getenv("OMPI_COMM_WORLD_SIZE")), size)
    assert.are.equal(tonumber(os.getenv("OMPI_COMM_WORLD_RANK")), rank)
  end)

  it("all_reduce sum / max / avg of f32 equal the f64 reference over the ranks' data", function()
    local n = 1000
    for _, op in ipairs({ "sum", "max", "avg" }) do
      local t = D.rank_data(n, rank, 11)
      w:all_reduce(t, op)
      local got = t:to_table()
      local want = {}
      for r = 0, size - 1 do
        local v = D.rank_data(n, r, 11):to_table()
        for i = 1, n do
          if op == "max" then want[i] = math.max(want[i] or -math.huge, v[i])
          else want[i] = (want[i] or 0) + v[i] end
        end
      end
      if op == "avg" then for i = 1, n do want[i] = want[i] / size end end
      if op == "max" then
        for i = 1, n do assert.are.equal(want[i], got[i]) end
      else
        assert.is_true(D.nmse(got, want) < 1e-13, op .. " nmse " .. D.nmse(got, want))
      end
    end
  end)

  it("all_reduce of bf16 rounds the sum of small integers exactly", function()
    local t = lutra.tensor({ 64 }, "bf16")
    local vals = {}
    for i = 1, 64 do vals[i] = (i % 7) + rank end
    t:set(vals)
    w:all_reduce(t, "sum")
    local got = t:to_table()
    for i = 1, 64 do assert.are.equal(size * (i % 7) + size * (size - 1) / 2, got[i]) end
  end)

  it("all_gather stacks the ranks' rows by rank", function()
    local x = D.rank_data(3 * 5, rank, 12):reshape({ 3, 5 })
    local y = lutra.tensor({ 3 * size, 5 }, "f32")
    y:fill(0 / 0)
    w:all_gather(x, y)
    local got = y:to_table()
    for r = 0, size - 1 do
      local v = D.rank_data(15, r, 12):to_table()
      for i = 1, 15 do assert.are.equal(v[i], got[r * 15 + i]) end
    end
  end)

  it("all_gather of FP8 codes equals gathering in high precision then quantizing", function()
    local r = lutra.recipe.delayed() -- every rank's scale is the initial 1: the codes agree
    for _, dtype in ipairs({ "f32", "bf16" }) do
      local ql = lutra.quantizer(r, "input", { columnwise = false })
      local qf = lutra.quantizer(r, "input", { columnwise = false })
      local qo = lutra.quantizer(r, "input", { columnwise = false })
      local xq = ql:quantize(D.rank_data(16 * 16, rank, 14, dtype):reshape({ 16, 16 }))
      local full = lutra.tensor({ 16 * size, 16 }, dtype)
      local vals = {}
      for k = 0, size - 1 do
        for _, v in ipairs(D.rank_data(16 * 16, k, 14, dtype):to_table()) do vals[#vals + 1] = v end
      end
      full:set(vals)
      local want = qf:quantize(full)
      local poison = lutra.tensor({ 16 * size, 16 }, dtype)
      poison:fill(0 / 0)
      local got = qo:quantize(poison)
      local before = w:stats().bytes
      w:all_gather(xq, got)
      assert.are.equal(16 * 16, w:stats().bytes - before) -- one byte per element sent
      assert.are.equal(want:bytes(), got:bytes())
    end
  end)

  it("reduce_scatter gives this rank's row block of the sum", function()
    local x = D.rank_data(4 * size * 3, rank, 13):reshape({ 4 * size, 3 })
    local y = lutra.tensor({ 4, 3 }, "f32")
    y:fill(0 / 0)
    w:reduce_scatter(x, y)
    local sum = {}
    for r = 0, size - 1 do
      local v = D.rank_data(4 * size * 3, r, 13):to_table()
      for i = 1, #v do sum[i] = (sum[i] or 0) + v[i] end
    end
    local want = {}
    for i = 1, 12 do want[i] = sum[rank * 12 + i] end
    assert.is_true(D.nmse(y:to_table(), want) < 1e-13)
  end)

  it("split forms groups by color, ordered by key; color < 0 joins none", function()
    local g = w:split(rank % 2, -rank)
    local members = math.floor((size - (rank % 2) + 1) / 2)
    assert.are.equal(members, g:size())
    -- keys are -rank: higher world ranks come first
    local above = 0
    for r = rank + 1, size - 1 do if r % 2 == rank % 2 then above = above + 1 end end
    assert.are.equal(above, g:rank())
    local none = w:split(rank == 0 and -1 or 0, 0)
    if rank == 0 then assert.is_nil(none) else assert.are.equal(size - 1, none:size()) end
  end)

  it("counts its collectives", function()
    local g = w:split(0, rank)
    local t = lutra.tensor({ 8 }, "f32")
    t:fill(1)
    for _ = 1, 3 do g:all_reduce(t) end
    local s = g:stats()
    assert.are.equal(3, s.all_reduce)
    assert.are.equal(0, s.all_gather)
    assert.are.equal(3 * 8 * 4, s.bytes)
  end)

  it("ranks that disagree on a shape are named in the error, on every rank", function()
    local t = lutra.tensor({ rank == 1 and 5 or 4 }, "f32")
    t:fill(1)
    local ok, err = pcall(w.all_reduce, w, t, "sum")
    assert.is_false(ok)
    assert.matches("lutra_group_all_reduce: ranks disagree on the all%-reduce's %(numel, dtype, op%): "
                   .. "rank 0 has %(4, 0, 0%), rank 1 has %(5, 0, 0%)", err)
  end)

  it("refuses bad input naming the call", function()
    local ok, err = pcall(w.all_reduce, w, lutra.tensor({ 4 }, "i32"), "sum")
    assert.is_false(ok)
    assert.matches("lutra_group_all_reduce: t must be f32 or bf16", err)
    ok, err = pcall(w.all_gather, w, lutra.tensor({ 2, 3 }, "f32"), lutra.tensor({ 2, 3 }, "f32"))
    assert.is_false(ok)
    assert.matches("lutra_group_all_gather: y has 2 rows", err)
    ok, err = pcall(w.all_reduce, w, lutra.tensor({ 4 }, "f32"), "min")
    assert.is_false(ok)
    assert.matches("op", err)
  end)
end)

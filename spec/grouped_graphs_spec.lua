-- GroupedLinear's per-expert path and its split-pattern cache (nn/grouped/) on the CPU,
-- where the patterns are tracked as on a device but always run directly (no graphs): keys per
-- pass, pattern and buffers, the least recently used pattern evicted at capacity, capacity 0
-- off, and results the same bit for bit with the cache off; the API's refusals. And the bound of
-- the GEMM plan cache (gemm/gemm.c: LUTRA_GEMM_PLAN_LIMIT), which the per-expert GEMMs of
-- changing splits would otherwise grow without end. The graphs themselves (captured on the
-- second sighting, replayed after) are spec/gpu/grouped_paths_gpu.lua's.
local lutra = require("lutra")
local nn = lutra.nn

local NUM, IN, OUT = 4, 24, 40

local function module(capacity)
  local m = nn.GroupedLinear(NUM, IN, OUT, { dtype = "f32", seed = 5 })
  m:set_path("per_expert")
  if capacity then m:set_graph_capacity(capacity) end
  return m
end

local function pattern(i, T)
  -- a distinct split pattern per i (sums to T), some experts empty
  local a = (i * 7) % (T + 1)
  local b = math.min(T - a, (i * 3) % 11)
  return { a, 0, b, T - a - b }
end

describe("GroupedLinear's split-pattern graph cache (per-expert path, cpu)", function()
  local T = 30
  local x = lutra.tensor({ T, IN }):randn(1)
  local dy = lutra.tensor({ T, OUT }):randn(2)

  it("tracks one entry per pattern and pass; a returning pattern is found again", function()
    local m = module()
    local s = m:graph_stats()
    assert.are.same({ 0, 16, 0, 0, 0, 0 },
                    { s.entries, s.capacity, s.captures, s.replays, s.direct, s.evictions })
    m:forward(x, pattern(1, T))
    assert.are.equal(1, m:graph_stats().entries)
    m:backward(dy) -- a second pass: its own key
    assert.are.equal(2, m:graph_stats().entries)
    m:forward(x, pattern(1, T))
    m:backward(dy)
    s = m:graph_stats()
    assert.are.equal(2, s.entries) -- found, not added
    assert.are.equal(4, s.direct) -- the CPU has no graphs: every pass ran directly
    assert.are.equal(0, s.captures)
    m:forward(x, pattern(2, T))
    assert.are.equal(3, m:graph_stats().entries)
    -- new buffers make a new key (a graph bakes their addresses)
    local x2 = lutra.tensor({ T, IN }):randn(1)
    m:forward(x2, pattern(2, T))
    assert.are.equal(4, m:graph_stats().entries)
  end)

  it("keeps at most capacity patterns, evicting the least recently used", function()
    local m = module(3)
    for i = 1, 3 do m:forward(x, pattern(i, T)) end
    assert.are.equal(3, m:graph_stats().entries)
    m:forward(x, pattern(1, T)) -- 1 is now the most recent; 2 the least
    assert.are.equal(0, m:graph_stats().evictions)
    m:forward(x, pattern(4, T)) -- evicts 2
    local s = m:graph_stats()
    assert.are.equal(3, s.entries)
    assert.are.equal(1, s.evictions)
    m:forward(x, pattern(1, T)) -- still there
    m:forward(x, pattern(3, T)) -- still there
    assert.are.equal(1, m:graph_stats().evictions)
    m:forward(x, pattern(2, T)) -- was evicted: comes back as new, evicting 4
    s = m:graph_stats()
    assert.are.equal(2, s.evictions)
    assert.are.equal(3, s.entries)
    for i = 5, 40 do m:forward(x, pattern(i, T)) end
    assert.are.equal(3, m:graph_stats().entries)
  end)

  it("gives the results of the cache off, bit for bit, over changing and returning patterns",
     function()
    local on, off = module(2), module(0)
    for step = 1, 12 do
      local sp = pattern(step % 4 + 1, T) -- four patterns through a cache of two
      local a, b = on:forward(x, sp), off:forward(x, sp)
      assert.are.equal(b:bytes(), a:bytes(), "y, step " .. step)
      local da, db = on:backward(dy), off:backward(dy)
      assert.are.equal(db:bytes(), da:bytes(), "dx, step " .. step)
      local pa, pb = on:parameters(), off:parameters()
      for i = 1, #pa do
        assert.are.equal(pb[i].grad:bytes(), pa[i].grad:bytes(), "grad " .. i)
      end
    end
    local s = off:graph_stats()
    assert.are.equal(0, s.capacity)
    assert.are.equal(0, s.entries)
    assert.are.equal(24, s.direct)
    assert.is_true(on:graph_stats().evictions > 0)
  end)

  it("set_graph_capacity empties the cache and keeps the counters", function()
    local m = module(4)
    for i = 1, 3 do m:forward(x, pattern(i, T)) end
    m:set_graph_capacity(8)
    local s = m:graph_stats()
    assert.are.equal(0, s.entries)
    assert.are.equal(8, s.capacity)
    assert.are.equal(3, s.direct)
  end)

  it("refuses bad capacities and other modules, naming the call", function()
    local m = module()
    for _, bad in ipairs { -1, 4097 } do
      assert.are.equal(lutra.C.LUTRA_EINVAL, lutra.C.lutra_grouped_set_graph_capacity(m, bad))
      assert.matches("lutra_grouped_set_graph_capacity: capacity must be in 0..4096",
                     lutra.ffi.string(lutra.C.lutra_last_error()), 1, true)
    end
    assert.are.equal(16, m:graph_stats().capacity) -- unchanged
    local lin = nn.Linear(4, 4)
    assert.are_not.equal(0, lutra.C.lutra_grouped_set_graph_capacity(lin, 2))
    assert.matches("not a grouped_linear", lutra.ffi.string(lutra.C.lutra_last_error()), 1, true)
    local st = lutra.ffi.new("lutra_grouped_graph_stats")
    assert.are_not.equal(0, lutra.C.lutra_grouped_graph_stats_get(lin, st))
    assert.are_not.equal(0, lutra.C.lutra_grouped_graph_stats_get(m, nil))
    assert.matches("lutra_grouped_graph_stats_get: out is NULL", lutra.ffi.string(lutra.C.lutra_last_error()), 1, true)
    assert.has_error(function() m:set_graph_capacity(1.5) end)
  end)
end)

describe("the GEMM plan cache's bound", function()
  it("frees its plans at LUTRA_GEMM_PLAN_LIMIT and remakes them, results unchanged", function()
    -- a fresh process, so that the limit is read at load and the count starts at zero
    local script = [[
      local lutra = require("lutra")
      local b = lutra.tensor({ 8, 16 }):randn(2)
      local most, first = 0, {}
      for round = 1, 2 do
        for m = 1, 40 do
          local a = lutra.tensor({ m, 16 }):randn(m)
          local d = lutra.tensor({ 8, m })
          lutra.gemm(a, true, b, false, d)
          if round == 1 then first[m] = d:bytes()
          elseif first[m] ~= d:bytes() then error("shape " .. m .. " differs after the flush") end
          most = math.max(most, (lutra.gemm_cache_stats()))
        end
      end
      print("most " .. most .. " now " .. lutra.gemm_cache_stats())
    ]]
    local f = assert(io.popen("LUA_PATH='lua/?.lua;lua/?/init.lua;;' LUTRA_GEMM_PLAN_LIMIT=16 " ..
                              "luajit -e '" .. script:gsub("'", "'\\''") .. "' 2>&1"))
    local out = f:read("*a")
    f:close()
    local most, now = out:match("most (%d+) now (%d+)")
    assert(most, out)
    assert.are.equal(16, tonumber(most)) -- reached, never passed
    assert.is_true(tonumber(now) <= 16)
  end)
end)

-- Eager kernel launches replayed as cached CUDA graphs (src/backend/cuda/call_graphs.c, the
-- launchers of src/backend/cuda/backend_cuda.c): a launcher's call seen again with the same
-- arguments on the same stream runs as a graph launch. A graph reads and writes memory when it
-- runs, so every call must still give what the CPU backend gives for that call's inputs, after
-- the inputs have changed in place (same pointers, new values) and the outputs were poisoned
-- with NaN (an output a graph did not write shows up). Bounds: the norms' (spec/gpu/norm_gpu.lua:
-- bf16 NMSE 1e-5), the activations' (spec/gpu/activation_gpu.lua: bf16 1e-5), FP8 codes exact
-- (current scaling: the scale the replay computes from the new amax must be the CPU's). On
-- cuda, lutra.launch_graph_stats() must show the calls served by graphs, and a cached call made
-- inside someone else's capture of lutra's stream must go into it as a child graph.
local lutra = require("lutra")
local ffi = require("ffi")
local nn, R = lutra.nn, lutra.recipe
local S = require("spec.gpu.support")
local DEV, REF, hold = S.DEV, S.REF, S.hold
local function test(name, fn) S.test(it, name, fn) end

local function served()
  local _, launches = lutra.launch_graph_stats()
  return launches
end

local same_values = S.same_values


local ROWS, HIDDEN = 130, 256

describe("kernel launches replayed as cached graphs on " .. DEV, function()
  test("LayerNorm forward and backward, inputs changed in place each call: the CPU's results",
       function()
    local seed = math.random(1, 2 ^ 30)
    local ma = hold(nn.LayerNorm(HIDDEN, { dtype = "bf16", device = REF }))
    local mb = hold(nn.LayerNorm(HIDDEN, { dtype = "bf16", device = DEV }))
    local pa, pb = ma:parameters(), mb:parameters()
    for i = 1, #pa do
      pa[i].value:randn(seed + i, i == 1 and 1 or 0, 0.3)
      pb[i].value:randn(seed + i, i == 1 and 1 or 0, 0.3)
    end
    local xa, xb = S.randn_pair({ ROWS, HIDDEN }, "bf16", seed + 10, 2)
    local ga, gb = S.randn_pair({ ROWS, HIDDEN }, "bf16", seed + 11, 1)
    local before = served()
    local yb, dxb
    for call = 1, 5 do
      -- new values in the same buffers; the last call's outputs poisoned
      xa:randn(seed + 20 + call, 0.5, 2)
      xb:randn(seed + 20 + call, 0.5, 2)
      ga:randn(seed + 40 + call)
      gb:randn(seed + 40 + call)
      if yb then
        yb:fill(0 / 0)
        dxb:fill(0 / 0)
        for i = 1, #pb do pb[i].grad:fill(0 / 0) end
      end
      yb = mb:forward(xb)
      S.assert_nmse(yb, ma:forward(xa), 1e-5, "call " .. call .. ": output")
      dxb = mb:backward(gb)
      S.assert_nmse(dxb, ma:backward(ga), 1e-5, "call " .. call .. ": input gradient")
      for i = 1, #pa do
        S.assert_nmse(pb[i].grad, pa[i].grad, 1e-5, "call " .. call .. ": param " .. i .. " grad")
      end
    end
    if DEV == "cuda" then
      -- calls 3 to 5 of the forward and the backward (the fills too, from their third)
      assert.is_true(served() - before >= 6, "the norm's later calls ran as graph launches")
    end
  end)

  test("SwiGLU and GELU activations, forward and backward, repeated: the CPU's results",
       function()
    local seed = math.random(1, 2 ^ 30)
    for _, kind in ipairs { "SwiGLU", "GELU" } do
      local ma, mb = hold(nn[kind]()), hold(nn[kind]())
      local cols = kind == "SwiGLU" and 2 * 96 or 96
      local out_cols = kind == "SwiGLU" and 96 or 96
      local xa, xb = S.randn_pair({ 70, cols }, "bf16", seed, 1)
      local ga, gb = S.randn_pair({ 70, out_cols }, "bf16", seed + 1, 1)
      local yb, dxb
      for call = 1, 4 do
        xa:randn(seed + 10 * call)
        xb:randn(seed + 10 * call)
        if yb then
          yb:fill(0 / 0)
          dxb:fill(0 / 0)
        end
        yb = mb:forward(xb)
        S.assert_nmse(yb, ma:forward(xa), 1e-5, kind .. " call " .. call .. ": output")
        dxb = mb:backward(gb)
        S.assert_nmse(dxb, ma:backward(ga), 1e-5, kind .. " call " .. call .. ": input gradient")
      end
    end
  end)

  test("a current-scaling cast repeated on new values: the CPU's codes, scale from the new amax",
       function()
    local seed = math.random(1, 2 ^ 30)
    local qa = hold(lutra.quantizer(R.current(), "input", { device = REF }))
    local qb = hold(lutra.quantizer(R.current(), "input", { device = DEV }))
    local xa, xb = S.randn_pair({ 96, 128 }, "bf16", seed, 1)
    local oa = lutra.tensor({ 96, 128 }, "f32", REF)
    local ob = lutra.tensor({ 96, 128 }, "f32", DEV)
    for call = 1, 4 do
      -- a different spread each call: a replay that kept the first scale would differ
      xa:randn(seed + call, 0, call)
      xb:randn(seed + call, 0, call)
      ob:fill(0 / 0)
      lutra.dequantize(qb:quantize(xb), ob, false)
      lutra.dequantize(qa:quantize(xa), oa, false)
      same_values(ob:to_table(), oa:to_table(), "call " .. call .. ": dequantized codes")
    end
  end)

  -- a cached call made while someone else captures lutra's stream (a plain
  -- cudaStreamBeginCapture, not lutra.graph) goes into that capture as a child graph
  test("inside someone else's capture of lutra's stream a cached norm goes in as a child graph",
       function()
    if DEV ~= "cuda" then return end -- a CUDA stream capture: nothing to check on the CPU
    S.with_caller_stream(function(rt, stream)
      local seed = math.random(1, 2 ^ 30)
      local ma = hold(nn.RMSNorm(HIDDEN, { dtype = "bf16", device = REF }))
      local mb = hold(nn.RMSNorm(HIDDEN, { dtype = "bf16", device = DEV }))
      ma:parameters()[1].value:randn(seed, 1, 0.3)
      mb:parameters()[1].value:randn(seed, 1, 0.3)
      local xa, xb = S.randn_pair({ ROWS, HIDDEN }, "bf16", seed + 1, 1)
      local eval = { grad = false }
      local yb
      for _ = 1, 3 do yb = mb:forward(xb, eval) end -- seen, captured, launched from its graph
      lutra.synchronize(DEV)
      local before = served()
      assert.are.equal(0, rt.cudaStreamBeginCapture(stream, 1))
      local okc, errc = pcall(function() mb:forward(xb, eval) end)
      local gbox, ebox = ffi.new("void *[1]"), ffi.new("void *[1]")
      local rc = rt.cudaStreamEndCapture(stream, gbox)
      assert(okc, errc)
      assert.are.equal(0, rc, "cudaStreamEndCapture")
      assert.are.equal(1, served() - before, "the norm served by its cached graph")
      assert.are.equal(0, rt.cudaGraphInstantiate(ebox, gbox[0], 0))
      xa:randn(seed + 2)
      xb:randn(seed + 2)
      yb:fill(0 / 0)
      lutra.synchronize(DEV)
      assert.are.equal(0, rt.cudaGraphLaunch(ebox[0], stream))
      assert.are.equal(0, rt.cudaStreamSynchronize(stream))
      S.assert_nmse(yb, ma:forward(xa, eval), 1e-5, "the captured norm: y")
      rt.cudaGraphExecDestroy(ebox[0])
      rt.cudaGraphDestroy(gbox[0])
    end)
  end)
  -- a launcher's cache (512 calls) at capacity: newcomers take the place of calls not served
  -- lately (call_graphs.c's clock), so a repeated call made after 700 others is still
  -- captured and served by its graph, and every fill writes its own value
  test("past a launcher cache's capacity a new repeated call is still served by a graph",
       function()
    local t = hold(lutra.tensor({ 64 }, "f32", DEV))
    local graphs_before = lutra.launch_graph_stats()
    for v = 1, 700 do
      t:fill(v)
      t:fill(v) -- the second sighting: captured and launched
      local got = t:to_table()
      if got[1] ~= v or got[64] ~= v then S.fail("fill %d: got %s, %s", v, got[1], got[64]) end
    end
    local before = served()
    for _ = 1, 3 do t:fill(-1.5) end
    local got = t:to_table()
    assert.are.equal(-1.5, got[1])
    assert.are.equal(-1.5, got[64])
    if DEV == "cuda" then
      assert.are.equal(2, served() - before, "the new call captured at its second sighting")
      local grown = lutra.launch_graph_stats() - graphs_before
      assert.is_true(grown <= 512, "graphs the fill cache added, at most its capacity: " .. grown)
    end
  end)
end)

-- lutra.graph on a machine where it cannot capture: every misuse is a clear error naming the
-- call, and no capture is left behind (the GPU suite, spec/gpu/graph_gpu.lua, replays steps).
local lutra = require("lutra")
local C = lutra.C

describe("lutra.graph", function()
  it("refuses the cpu device", function()
    local ran = 0
    local ok, err = pcall(lutra.graph.capture, function() ran = ran + 1 end, { device = "cpu", warmup = 2 })
    assert.is_false(ok)
    assert.matches("lutra_graph_begin: CUDA graphs need the cuda device, not cpu", err, 1, true)
    assert.are.equal(2, ran, "the warm-up steps ran before the capture was refused")
    assert.is_false(lutra.graph.capturing())
  end)

  it("checks its arguments", function()
    local ok, err = pcall(lutra.graph.capture, 42)
    assert.is_false(ok)
    assert.matches("lutra.graph.capture: expects a function", err, 1, true)
    ok, err = pcall(lutra.graph.capture, function() end, { warmup = -1, device = "cpu" })
    assert.is_false(ok)
    assert.matches("warmup must be a whole number", err, 1, true)
    ok, err = pcall(lutra.graph.capture, function() end, { warmups = 1 })
    assert.is_false(ok)
    assert.matches("warmups", err, 1, true)
  end)

  it("ends nothing that was not begun", function()
    local box = lutra.ffi.new("lutra_graph*[1]")
    assert.are_not.equal(0, C.lutra_graph_end(box))
    assert.matches("lutra_graph_end: no capture is in progress on this thread",
                   lutra.ffi.string(C.lutra_last_error()), 1, true)
    assert.are.equal(0, C.lutra_graph_abort())
    assert.are_not.equal(0, C.lutra_graph_replay(nil))
    assert.matches("lutra_graph_replay", lutra.ffi.string(C.lutra_last_error()), 1, true)
  end)
end)

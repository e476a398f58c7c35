--- CUDA graphs of whole training steps.
--   local g = lutra.graph.capture(function()
--     scope:run(function() out = net:forward(x) end)
--     loss:forward(out, target); net:backward(loss:backward()); opt:step()
--   end, { warmup = 1 })
--   for step = 1, n do x:set(next_batch()); g:replay() end
-- capture(fn) runs fn `warmup` times eagerly (default 1: buffers, GEMM plans and workspaces
-- are made there; these are real training steps), then once under capture; the returned graph
-- replays everything fn issued with one launch. Inside fn, what a graph cannot hold raises an
-- error naming it (allocations from new shapes, reading values on the host, cpu tensors) and
-- the capture is discarded. The graph uses the buffers fn used: keep those objects alive.
-- @module lutra.graph
local core = require("lutra.core")
local ffi, C, check = core.ffi, core.C, core.check

local M = {}
local Graph = {}
Graph.__index = Graph

local graph_box = ffi.new("lutra_graph*[1]")
local info_box = ffi.new("int64_t[2]")

--- Captures fn into a CUDA graph after warmup eager runs (see the module's description).
--
-- @tparam function fn one training step
--
-- @tparam[opt] table opts {warmup = 1, device = "cuda"}
function M.capture(fn, opts)
  local where = "lutra.graph.capture"
  if type(fn) ~= "function" then error(where .. ": expects a function", 2) end
  opts = core.check_options(opts, { warmup = true, device = true }, where)
  local warmup = opts.warmup == nil and 1 or opts.warmup
  if type(warmup) ~= "number" or warmup < 0 or warmup % 1 ~= 0 then
    error(where .. ": warmup must be a whole number >= 0", 2)
  end
  local device = core.device(opts.device or "cuda", where)
  for _ = 1, warmup do fn() end
  -- finalize the garbage now rather than during the capture (frees are deferred there anyway)
  collectgarbage()
  check(C.lutra_graph_begin(device))
  local ok, err = pcall(fn)
  if not ok then
    C.lutra_graph_abort()
    error(err, 0)
  end
  check(C.lutra_graph_end(graph_box))
  return ffi.gc(graph_box[0], C.lutra_graph_unref)
end

--- @section end

--- Whether this thread is capturing a graph now.
-- @treturn boolean
function M.capturing() return C.lutra_graph_capturing() ~= 0 end

--- A captured CUDA graph (lutra.graph.capture).
-- @type Graph

--- Runs the captured step again with one launch.
function Graph:replay()
  if C.lutra_graph_replay(self) ~= 0 then core.fail() end
end

--- The graph's size and use.
-- @return nodes (kernels, copies, memsets in the graph), replays (so far)
function Graph:info()
  check(C.lutra_graph_info(self, info_box, info_box + 1))
  return tonumber(info_box[0]), tonumber(info_box[1])
end

--- Frees the graph now, releasing the objects it held.
function Graph:destroy() check(C.lutra_graph_destroy(self)) end

ffi.metatype("struct lutra_graph", { __index = Graph })
return M

--- GroupedLinear (lutra.nn.GroupedLinear): num_gemms Linears over consecutive row ranges of one
-- input (the experts of a mixture-of-experts layer), as one grouped call per pass
-- (src/nn/grouped_linear.c).
--   local experts = nn.GroupedLinear(8, 64, 256, {bias = true, dtype = "bf16", device = "cuda"})
--   local y = experts:forward(x, m_splits)      -- x [sum(m_splits), 64] -> y [rows, 256]
--   local dx = experts:backward(dy)
-- m_splits is a Lua table of num_gemms row counts, an i32 tensor on the CPU (host splits:
-- checked at once), or an i32 tensor on the module's device (device splits: never read by the
-- host; a bad one sets a device flag that experts:check_splits() reports, as a loss reports its
-- labels). The third argument of forward is what Module:forward takes as its second.
-- @module lutra.grouped
local core = require("lutra.core")
local chk = require("lutra.check")
local ffi, C, check = core.ffi, core.C, core.check
local istype, tensor_t, struct_tensor_t = ffi.istype, chk.tensor_t, ffi.typeof("lutra_tensor")

local M = {}

local module_box = ffi.new("lutra_module*[1]")
local int32_ptr = ffi.typeof("int32_t *")

-- module handle -> {tensor = host i32 tensor [num_gemms], ptr = its data, n = num_gemms}: the
-- buffer a Lua table of splits is written into, made once per module
local host_splits = setmetatable({}, { __mode = "k" })

-- n: num_gemms of a GroupedLinear m; for a module that holds GroupedLinears (a Sequential),
-- given, the length of the table given (any = true: remade when another length comes; C checks
-- it against each GroupedLinear)
local function new_host_splits(m, given)
  local n, any = given, true
  if C.lutra_grouped_num_gemms(m, core.int_box) == 0 then n, any = core.int_box[0], nil end
  local shape = ffi.new("int64_t[1]", n)
  check(C.lutra_tensor_new(C.LUTRA_I32, 1, shape, C.LUTRA_CPU, core.tensor_box))
  local t = ffi.gc(core.tensor_box[0], C.lutra_tensor_unref)
  local entry = { tensor = t, ptr = ffi.cast(int32_ptr, t.data), n = n, any = any }
  host_splits[m] = entry
  return entry
end

--- nn.GroupedLinear: num_gemms experts, each a Linear of in_features -> out_features; expert
-- e's weights start as a Linear's made with seed + e. Its forward is forward(x, m_splits,
-- opts): x [sum(m_splits), in_features] -> [rows, out_features].
-- @tparam integer num_gemms the number of experts, 1 to 65536
-- @tparam integer in_features
-- @tparam integer out_features
-- @tparam[opt] table opts {bias = true, dtype = "f32", device =, accumulate_main_grad = false,
-- seed =, parallel_mode = "column" | "row", tp_group =, sequence_parallel = false, name =}
-- (tensor parallel: every expert sharded as a parallel Linear, the features given are the full
-- layer's; name: what a factory recipe is told, lutra.recipe.custom{factory = ...})
-- @return the module
function M.GroupedLinear(num_gemms, in_features, out_features, opts)
  local where = "lutra.nn.GroupedLinear"
  opts = core.check_options(opts, { bias = true, dtype = true, device = true, seed = true,
                                    accumulate_main_grad = true, parallel_mode = true,
                                    tp_group = true, sequence_parallel = true, name = true },
                              where)
  if opts.name ~= nil then chk.string(opts.name, "name", where) end
  chk.integer(num_gemms, "num_gemms", where, 1, 65536)
  chk.integer(in_features, "in_features", where, 1, 2 ^ 53)
  chk.integer(out_features, "out_features", where, 1, 2 ^ 53)
  local d = ffi.new("lutra_grouped_linear_desc")
  C.lutra_grouped_linear_defaults(d)
  d.num_gemms = num_gemms
  d.in_features = in_features
  d.out_features = out_features
  d.bias = chk.flag(opts.bias, "bias", where, d.bias)
  if opts.dtype ~= nil then d.dtype = core.code(core.dtypes, opts.dtype, "dtype", where) end
  d.device = core.device(opts.device, where)
  if opts.seed ~= nil then d.seed = chk.seed(opts.seed, "seed", where) end
  d.accumulate_main_grad = chk.flag(opts.accumulate_main_grad, "accumulate_main_grad", where, 0)
  if opts.parallel_mode ~= nil or opts.tp_group ~= nil or opts.sequence_parallel ~= nil then
    -- tensor parallel (lutra/tp_modules.h): the features given are the full layer's
    check(C.lutra_grouped_linear_parallel_new(d, require("lutra.dist").tp_desc(opts, where),
                                              module_box))
  else
    check(C.lutra_grouped_linear_new(d, module_box))
  end
  local m = ffi.gc(module_box[0], C.lutra_module_unref)
  new_host_splits(m)
  return core.set_name(m, opts.name)
end

--- Whether a forward's second argument is m_splits (a tensor or a list of numbers).
-- @local lutra.nn's Module:forward uses it
function M.is_splits(v)
  if istype(tensor_t, v) or istype(struct_tensor_t, v) then return true end
  return type(v) == "table" and v[1] ~= nil
end

local function bad_split(where, i, v)
  error(string.format("%s: m_splits[%d] must be an integer >= 0 (got %s)", where, i,
                      chk.got(v)), 4)
end

--- m_splits as an i32 tensor: a table is written into the module's host buffer.
-- @local lutra.nn's Module:forward uses it
function M.splits_tensor(m, splits, where)
  where = where or "module:forward"
  if type(splits) == "table" then
    local entry = host_splits[m] or new_host_splits(m, #splits)
    local n = entry.n
    if #splits ~= n and entry.any then
      entry = new_host_splits(m, #splits)
      n = entry.n
    end
    if #splits ~= n then
      error(string.format("%s: m_splits has %d entries, the module has %d experts", where,
                          #splits, n), 3)
    end
    local p = entry.ptr
    for i = 1, n do
      local v = splits[i]
      if type(v) ~= "number" or v < 0 or v >= 2 ^ 31 or v ~= math.floor(v) then
        bad_split(where, i, v)
      end
      p[i - 1] = v
    end
    return entry.tensor
  end
  return splits
end

--- A GroupedLinear's own methods, beside those of every module (lutra.nn's Module: forward
-- with m_splits, backward, parameters, ...). Calling one on another kind of module is an error
-- naming both ("Linear has no method 'set_splits'").
-- @type GroupedLinear
local GroupedLinear = {}

--- Sets the splits of the next forward(x) without m_splits (the forward of a Sequential
-- holding this module).
-- @param splits a table of num_gemms row counts, or an i32 tensor (host or device), as
-- forward's second argument
function GroupedLinear:set_splits(splits)
  if not M.is_splits(splits) then
    error("module:set_splits: m_splits must be a table of row counts or an i32 tensor (got "
          .. chk.got(splits) .. ")", 2)
  end
  if C.lutra_grouped_set_splits(self, M.splits_tensor(self, splits, "module:set_splits")) ~= 0 then
    core.fail()
  end
end

--- Raises the error of a bad device m_splits (a split < 0, or splits not summing to the
-- input's rows) met by a call since the last check, else returns nothing. A host read: it
-- waits for the device.
function GroupedLinear:check_splits()
  check(C.lutra_grouped_check(self))
end

local paths = { grouped = 0, per_expert = 1 }
--- Chooses how a high-precision forward with host-known splits runs (lutra_grouped_set_path).
-- @tparam string path "grouped" (the default: one grouped GEMM) or "per_expert" (one GEMM an
-- expert, replayed as cached graphs on cuda)
function GroupedLinear:set_path(path)
  check(C.lutra_grouped_set_path(self, core.code(paths, path, "path", "module:set_path")))
end

local graph_stats = ffi.new("lutra_grouped_graph_stats")
--- Sets how many graphs of the per-expert path (one per host split pattern and pass,
-- lutra/grouped_graphs.h) the module keeps; refused while capturing a graph.
-- @tparam integer n 0 (no graphs) to 4096
function GroupedLinear:set_graph_capacity(n)
  chk.integer(n, "capacity", "module:set_graph_capacity", 0, 4096)
  check(C.lutra_grouped_set_graph_capacity(self, n))
end

--- The per-expert path's graph cache counters.
-- @treturn table {entries =, capacity =, captures =, replays =, direct =, evictions =}
function GroupedLinear:graph_stats()
  check(C.lutra_grouped_graph_stats_get(self, graph_stats))
  local s = graph_stats
  return { entries = s.entries, capacity = s.capacity, captures = tonumber(s.captures),
           replays = tonumber(s.replays), direct = tonumber(s.direct),
           evictions = tonumber(s.evictions) }
end

--- The number of experts (GEMMs) the module was made with.
-- @treturn integer
function GroupedLinear:num_gemms()
  check(C.lutra_grouped_num_gemms(self, core.int_box))
  return core.int_box[0]
end

require("lutra.module_methods").define("grouped_linear", "GroupedLinear", GroupedLinear)

return M

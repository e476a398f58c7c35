--- Process groups over MPI (CPU collectives) and NCCL (CUDA): src/lutra/dist.h.
--   local dist = lutra.dist
--   dist.init()                      -- MPI_Init unless the host did
--   local world = dist.world()
--   local tp = world:split(world:rank() // 2, world:rank())
--   lutra.autocast{recipe = r, group = world}   -- one amax all-reduce per step
-- Groups are C objects (refcounted): a handle keeps its group alive; scopes and parallel
-- modules hold their own reference.
-- @module lutra.dist
local core = require("lutra.core")
local chk = require("lutra.check")
local ffi, C, check = core.ffi, core.C, core.check

local M = {}
local Group = {}
Group.__index = Group

local group_box = ffi.new("lutra_group*[1]")
local int_box = ffi.new("int[1]")

local function own(g) return ffi.gc(g, C.lutra_group_unref) end

--- The reduction ops of all_reduce: "sum", "max", "avg".
-- @table ops
M.ops = { sum = C.LUTRA_REDUCE_SUM, max = C.LUTRA_REDUCE_MAX, avg = C.LUTRA_REDUCE_AVG }

--- Whether this build has MPI (and NCCL with CUDA); without it the other calls are refused.
-- @treturn boolean
function M.available() return C.lutra_dist_available() ~= 0 end

--- Starts the process groups: MPI_Init unless the host did. Call once per process.
-- @tparam[opt] table opts {timeout = seconds, comm = a cdata pointer to an MPI_Comm (the
-- world's communicator; default MPI_COMM_WORLD)}: timeout bounds how long a collective waits
-- for its peers (default LUTRA_DIST_TIMEOUT, else 300 s)
function M.init(opts)
  local where = "lutra.dist.init"
  opts = core.check_options(opts, { timeout = true, comm = true }, where)
  local timeout = opts.timeout or 0
  chk.finite(timeout, "timeout", where)
  check(C.lutra_dist_init(opts.comm, timeout))
end

--- Ends the process groups (MPI_Finalize when init called MPI_Init).
function M.finalize() check(C.lutra_dist_finalize()) end

--- Ends every process of the job (MPI_Abort), for a rank that saw a collective fail.
-- @tparam[opt] integer code the exit status, 0 to 255 (default 1)
function M.abort(code)
  chk.integer(code or 1, "code", "lutra.dist.abort", 0, 255)
  check(C.lutra_dist_abort(code or 1))
end

--- The group of every process of the job.
-- @return a group (a handle of its own)
function M.world()
  check(C.lutra_dist_world(group_box))
  return own(group_box[0])
end

--- A process group (dist.world(), group:split): its rank and size and its collectives. The
-- collectives are collective: every rank of the group calls them, in the same order.
-- @type Group

--- Splits the group: the ranks that give one color form a new group, ordered by key
-- (collective).
-- @tparam integer color the new group's tag; < 0 joins no group
-- @tparam[opt] integer key the order inside the new group (default 0: by rank)
-- @return the new group, or nil for color < 0
function Group:split(color, key)
  local where = "group:split"
  chk.integer(color, "color", where, -2 ^ 31, 2 ^ 31 - 1)
  chk.integer(key or 0, "key", where, -2 ^ 31, 2 ^ 31 - 1)
  check(C.lutra_group_split(self, color, key or 0, group_box))
  if group_box[0] == nil then return nil end
  return own(group_box[0])
end

--- This process's rank in the group, 0-based.
-- @treturn integer
function Group:rank()
  check(C.lutra_group_rank(self, int_box))
  return int_box[0]
end

--- The number of processes in the group.
-- @treturn integer
function Group:size()
  check(C.lutra_group_size(self, int_box))
  return int_box[0]
end

local stats_box = ffi.new("lutra_group_stats")
--- The collectives this group ran so far.
-- @treturn table {all_reduce =, all_gather =, reduce_scatter =, broadcast =, amax_reduce =,
-- bytes =} (counts, and the bytes sent)
function Group:stats()
  check(C.lutra_group_stats_get(self, stats_box))
  return { all_reduce = tonumber(stats_box.all_reduce), all_gather = tonumber(stats_box.all_gather),
           reduce_scatter = tonumber(stats_box.reduce_scatter),
           broadcast = tonumber(stats_box.broadcast), amax_reduce = tonumber(stats_box.amax_reduce),
           bytes = tonumber(stats_box.bytes) }
end

--- Reduces t over the group, in place (collective).
-- @param t a tensor of the same shape and dtype on every rank
-- @tparam[opt] string op "sum" (the default), "max" or "avg"
-- @return t
function Group:all_reduce(t, op)
  chk.tensor(t, "t", "group:all_reduce")
  check(C.lutra_group_all_reduce(self, t, core.code(M.ops, op or "sum", "op", "group:all_reduce")))
  return t
end

--- Gathers every rank's x into y, in rank order along the first dim (collective).
-- @param x this rank's part
-- @param y the whole: size() times x's rows
-- @return y
function Group:all_gather(x, y)
  chk.tensor(x, "x", "group:all_gather")
  chk.tensor(y, "y", "group:all_gather")
  check(C.lutra_group_all_gather(self, x, y))
  return y
end

--- Sums x over the group and gives each rank its part, in rank order along the first dim
-- (collective).
-- @param x the whole, on every rank
-- @param y this rank's part: x's rows divided by size()
-- @return y
function Group:reduce_scatter(x, y)
  chk.tensor(x, "x", "group:reduce_scatter")
  chk.tensor(y, "y", "group:reduce_scatter")
  check(C.lutra_group_reduce_scatter(self, x, y))
  return y
end

--- Waits until every rank of the group reached it (collective).
function Group:barrier() check(C.lutra_group_barrier(self)) end


ffi.metatype("struct lutra_group", { __index = Group })

--- @section end

local tp_modes = { column = C.LUTRA_TP_COLUMN, row = C.LUTRA_TP_ROW }
--- The lutra_tp_desc of a parallel module's options {parallel_mode = "column"|"row",
-- tp_group =, sequence_parallel = false} (parsed once, at construction).
-- @local internal: lutra.nn's parallel constructors call it
function M.tp_desc(opts, where)
  local d = ffi.new("lutra_tp_desc")
  if tp_modes[opts.parallel_mode] == nil then
    chk.fail(where, "parallel_mode must be \"column\" or \"row\" (got %s)", chk.got(opts.parallel_mode))
  end
  d.mode = tp_modes[opts.parallel_mode]
  if not ffi.istype(chk.group_t, opts.tp_group) then
    chk.fail(where, "tp_group must be a group (got %s)", chk.got(opts.tp_group))
  end
  d.group = opts.tp_group
  d.sequence_parallel = chk.flag(opts.sequence_parallel, "sequence_parallel", where, 0)
  return d
end

local Sync = {}
Sync.__index = Sync
local sync_box = ffi.new("lutra_grad_sync*[1]")
--- Data parallel: averages a module's gradients over a group after each backward (one
-- all-reduce per bucket of gradients).
-- @param group the data-parallel group
-- @param module the module (its parameters and its children's)
-- @tparam[opt] table opts {bucket_bytes = 25 MiB}
-- @return a grad sync: sync:run() after the backward, or sync:begin() before it
function M.grad_sync(group, module, opts)
  local where = "lutra.dist.grad_sync"
  opts = core.check_options(opts, { bucket_bytes = true }, where)
  chk.integer(opts.bucket_bytes or 0, "bucket_bytes", where, 0, 2 ^ 53)
  check(C.lutra_grad_sync_new(group, module, opts.bucket_bytes or 0, sync_box))
  return ffi.gc(sync_box[0], C.lutra_grad_sync_unref)
end
--- A grad sync (dist.grad_sync).
-- @type Sync

--- Arms the sync before the backward: each bucket's all-reduce starts as soon as its gradients
-- are done (overlapped with the rest of the backward); the optimizer's step waits for them by
-- itself (an optimizer over any of the synced parameters).
function Sync:begin() check(C.lutra_grad_sync_begin(self)) end
--- Waits for the armed all-reduces now, for code that reads the gradients before the step (a
-- second finish does nothing).
function Sync:finish() check(C.lutra_grad_sync_finish(self)) end
--- After the backward: begin (when not armed) and finish.
function Sync:run() check(C.lutra_grad_sync_run(self)) end
local buckets_box, elems_box, early_box = ffi.new("int[1]"), ffi.new("int64_t[1]"), ffi.new("int[1]")
--- The sync's layout and its last step.
-- @return buckets (collectives per step), elements (gradient elements synced), early (buckets
-- the last step started before its backward ended)
function Sync:info()
  check(C.lutra_grad_sync_info(self, buckets_box, elems_box, early_box))
  return buckets_box[0], tonumber(elems_box[0]), early_box[0]
end
ffi.metatype("struct lutra_grad_sync", { __index = Sync })

return M

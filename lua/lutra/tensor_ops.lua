--- Tensor operations for blocks written in Lua and for generation (src/lutra/tensor_ops.h), on
-- every backend. Methods of every tensor, and lutra.add / lutra.sample / lutra.softmax /
-- lutra.argmax:
--   y = lutra.add(x, fx, y)                 -- y = x + fx (y reused: no allocation)
--   dx:add_(dy)                             -- dx += dy; dx:add_(dy, 0.5): dx += 0.5 dy
--   g:scale_(0.1)
--   local last = h:select(2, T, last)       -- h {B, T, C}: the last position of each sequence
--   local first8 = x:rows(1, 8)             -- a view (no copy) of x's first 8 rows
--   local ids = lutra.sample(logits, {temperature = 0.8, top_k = 40, seed = 7, out = ids})
-- Indices given here are 1-based (Lua's); ids that come back (argmax, sample) are 0-based, as
-- class labels and embedding ids are. Every op takes an out (or a view to re-point) for loops:
-- given one, nothing is allocated. Float math is f32, rounded once into a bf16 or f16 output.
-- @module lutra.tensor_ops
local core = require("lutra.core")
local chk = require("lutra.check")
local ffi, C, check = core.ffi, core.C, core.check

local M = {}

local tensor_box = ffi.new("lutra_tensor*[1]")
local shape_buf = ffi.new("int64_t[4]")
local seed_box = ffi.new("uint64_t[1]")

local function need(v, name, where)
  if not chk.is_tensor(v) then
    error(string.format("%s: %s must be a tensor (got %s)", where, name, chk.got(v)), 3)
  end
end

-- options tables whose keys were checked: a loop that passes the same table again checks only
-- its values (a pairs loop per call would keep the loop from compiling into one trace)
local checked = setmetatable({}, { __mode = "k" })
local no_options = {}
local function options(opts, allowed, where)
  if opts == nil then return no_options end
  if checked[opts] == nil then
    core.check_options(opts, allowed, where)
    checked[opts] = true
  end
  return opts
end

local function optional(v, name, where)
  if v ~= nil then need(v, name, where) end
end

--- Installs the methods into the tensor metatype's method table.
-- @local called once by lutra.tensor, which passes its Tensor table and new (lutra.tensor)
function M.install(Tensor, new)
  -- a new tensor of shape dims(t) without the last dim ({1} for a 1-dim t), i32
  local function ids_like(t)
    local n = t.ndim
    if n == 1 then return new({ 1 }, "i32", t:device_name()) end
    local s = {}
    for i = 0, n - 2 do s[i + 1] = tonumber(t.shape[i]) end
    return new(s, "i32", t:device_name())
  end

  --- self += alpha * other, in place (f32 math, rounded once).
  -- @param other a tensor of self's shape, dtype and device
  -- @tparam[opt] number alpha default 1
  -- @return self
  function Tensor:add_(other, alpha)
    need(other, "other", "tensor:add_")
    if alpha ~= nil then chk.finite(alpha, "alpha", "tensor:add_") end
    if C.lutra_add_scaled(self, other, alpha or 1, self) ~= 0 then core.fail() end
    return self
  end

  --- self *= s, in place.
  -- @tparam number s
  -- @return self
  function Tensor:scale_(s)
    chk.finite(s, "s", "tensor:scale_")
    if C.lutra_tensor_scale(self, s) ~= 0 then core.fail() end
    return self
  end

  --- A view of count rows of the leading dim from row first (1-based): the same memory, no
  -- copy. The view keeps self's buffer allocated while it lives (even once self was destroyed,
  -- or its module replaced it: the view then reads the old buffer). With view (a tensor an
  -- earlier rows call returned), that view is re-pointed instead: no allocation, for loops.
  -- @tparam integer first 1-based
  -- @tparam[opt] integer count default 1
  -- @param[opt] view a view to re-point
  -- @return the view
  function Tensor:rows(first, count, view)
    local where = "tensor:rows"
    chk.integer(first, "first", where, 1)
    if count ~= nil then chk.integer(count, "count", where, 1) end
    optional(view, "view", where)
    if view ~= nil then
      if C.lutra_tensor_view_rows_into(view, self, first - 1, count or 1) ~= 0 then core.fail() end
      return view
    end
    if C.lutra_tensor_view_rows(self, first - 1, count or 1, tensor_box) ~= 0 then core.fail() end
    return ffi.gc(tensor_box[0], C.lutra_tensor_unref)
  end

  --- A copy of self with dim fixed at index (both 1-based): h {B, T, C}:select(2, T) gives
  -- the last position of each sequence, {B, C}. (Rows of the leading dim have a view: rows.)
  -- @tparam integer dim 1-based
  -- @tparam integer index 1-based
  -- @param[opt] out a tensor of self's shape without dim (made when nil)
  -- @return out
  function Tensor:select(dim, index, out)
    local where = "tensor:select"
    if type(dim) ~= "number" or dim % 1 ~= 0 or dim < 1 or dim > self.ndim then
      error(string.format("%s: dim must be one of the tensor's dims 1..%d (got %s)", where,
                          self.ndim, chk.got(dim)), 2)
    end
    chk.integer(index, "index", where, 1)
    optional(out, "out", where)
    if out == nil then
      local s = {}
      for i = 0, self.ndim - 1 do
        if i ~= dim - 1 then s[#s + 1] = tonumber(self.shape[i]) end
      end
      if #s == 0 then s[1] = 1 end
      out = new(s, self:dtype_name(), self:device_name())
    end
    if C.lutra_tensor_select(self, dim - 1, index - 1, out) ~= 0 then core.fail() end
    return out
  end

  --- The index (0-based) of the largest value of each row over the last dim: an i32 tensor of
  -- the leading dims (the first on a tie; NaNs ignored).
  -- @param[opt] out an i32 tensor of self's leading dims (made when nil)
  -- @return the ids
  function Tensor:argmax(out)
    optional(out, "out", "tensor:argmax")
    out = out or ids_like(self)
    if C.lutra_argmax(self, out) ~= 0 then core.fail() end
    return out
  end

  local softmax_opts = { temperature = true, out = true }
  --- softmax(self / temperature) over the last dim, in f32.
  -- @tparam[opt] table opts {temperature = 1, out = (a float tensor of self's shape; made in
  -- self's dtype when nil)}
  -- @return out
  function Tensor:softmax(opts)
    local where = "tensor:softmax"
    opts = options(opts, softmax_opts, where)
    optional(opts.out, "out", where)
    local t = opts.temperature
    if t ~= nil then chk.finite(t, "temperature", where) end
    local out = opts.out or new(self:dims(), self:dtype_name(), self:device_name())
    if C.lutra_softmax(self, t or 1, out) ~= 0 then core.fail() end
    return out
  end

  local sample_opts = { temperature = true, top_k = true, seed = true, out = true }
  --- One id (0-based) per row, drawn from softmax(self / temperature) over the last dim after
  -- keeping the top_k largest logits (ties at the k-th are kept). Deterministic for a seed on
  -- each backend; the CPU's and CUDA's draws use the same uniform numbers but sum the
  -- probabilities in different orders, so a draw within rounding of a boundary may differ
  -- between them. temperature 0 is greedy: argmax.
  -- @tparam[opt] table opts {temperature = 1, top_k = 0 (all), seed = (the global
  -- generator's next: lutra.manual_seed), out = (an i32 tensor of the leading dims)}
  -- @return the ids
  function Tensor:sample(opts)
    local where = "tensor:sample"
    opts = options(opts, sample_opts, where)
    optional(opts.out, "out", where)
    local t, k, seed = opts.temperature, opts.top_k, opts.seed
    if t ~= nil then chk.finite(t, "temperature", where) end
    if k ~= nil then chk.integer(k, "top_k", where, 0, 2 ^ 31 - 1) end
    local out = opts.out or ids_like(self)
    if t == 0 then
      if C.lutra_argmax(self, out) ~= 0 then core.fail() end
      return out
    end
    if seed == nil then
      check(C.lutra_seed_next(seed_box))
      seed = seed_box[0]
    else
      chk.seed(seed, "seed", where)
    end
    if C.lutra_sample(self, t or 1, k or 0, seed, out) ~= 0 then core.fail() end
    return out
  end
end

--- lutra.add(a, b, out): out = a + b (f32 math, rounded once); out may be a or b.
-- @param a
-- @param b a tensor of a's shape, dtype and device
-- @param[opt] out a tensor of a's shape, dtype and device (made when nil)
-- @return out
function M.add(a, b, out)
  local where = "lutra.add"
  need(a, "a", where)
  need(b, "b", where)
  optional(out, "out", where)
  if out == nil then
    local n = a.ndim
    for i = 0, n - 1 do shape_buf[i] = a.shape[i] end
    check(C.lutra_tensor_new(a.dtype, n, shape_buf, a.device, tensor_box))
    out = ffi.gc(tensor_box[0], C.lutra_tensor_unref)
  end
  if C.lutra_add_scaled(a, b, 1, out) ~= 0 then core.fail() end
  return out
end

--- lutra.sample(logits, opts): logits:sample(opts) (see Tensor's sample).
-- @param logits
-- @tparam[opt] table opts
function M.sample(logits, opts)
  need(logits, "logits", "lutra.sample")
  return logits:sample(opts)
end

--- lutra.softmax(x, opts): x:softmax(opts).
-- @param x
-- @tparam[opt] table opts
function M.softmax(x, opts)
  need(x, "x", "lutra.softmax")
  return x:softmax(opts)
end

--- lutra.argmax(x, out): x:argmax(out).
-- @param x
-- @param[opt] out
function M.argmax(x, out)
  need(x, "x", "lutra.argmax")
  return x:argmax(out)
end

return M

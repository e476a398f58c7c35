--- Tensors: lutra_tensor* cdata with methods. Tensors made here are owned by Lua (freed by the
-- GC or by :destroy()); tensors returned by modules, quantizers and losses are owned by them and
-- reach Lua through M.borrow, whose handle keeps the owner alive.
-- @module lutra.tensor
local core = require("lutra.core")
local chk = require("lutra.check")
local ffi, C, check = core.ffi, core.C, core.check

local M = {}
local Tensor = {}
Tensor.__index = Tensor

local dtype_names = {}
for name, code in pairs(core.dtypes) do dtype_names[tonumber(code)] = name end
local device_names = {}
for name, code in pairs(core.devices) do device_names[tonumber(code)] = name end
local scaling_names = { [0] = "none", "tensor", "mxfp8", "block_1d", "block_2d", "rowwise",
                        "nvfp4" }

local shape_buf = ffi.new("int64_t[4]")

local function fill_shape(shape, where)
  if type(shape) ~= "table" then error(where .. ": shape must be a table of dims", 3) end
  local n = #shape
  if n < 1 or n > 4 then error(where .. ": shape must have 1 to 4 dims", 3) end
  for i = 1, n do
    local d = shape[i]
    -- |d| <= 2^53: a Lua number holds it exactly and int64_t takes it; the C side refuses
    -- dims < 1 and products whose byte count overflows
    if type(d) ~= "number" or d ~= math.floor(d) or d > 2 ^ 53 or d < -2 ^ 53 then
      error(string.format("%s: dim %d must be an integer (got %s)", where, i, chk.got(d)), 3)
    end
    shape_buf[i - 1] = d
  end
  return n
end

local function own(t)
  return ffi.gc(t, C.lutra_tensor_unref)
end

-- One handle per borrowed tensor shell, keyed by its address: a forward that returns the same
-- buffer again returns the same handle, so the steady loop allocates nothing and registers no
-- finalizer. The handle holds a reference to the shell (the C side marks it FREED when the
-- owner frees or replaces its buffers, and frees it only after this reference goes) and, through
-- M.owners, the owner, so that the garbage collector cannot free a module while its output is
-- in use. A key stays valid while its handle lives: the shell, hence its address, cannot be
-- reused before the handle's finalizer has run. One shared finalizer and no closure: a handle
-- made inside a compiled loop (after the GC took the previous one) must not abort the trace.
local handles = setmetatable({}, { __mode = "v" })
-- handle -> owner: weak keys, strong values (no ephemerons in LuaJIT): the owner lives while
-- the handle does, and the entry goes with the handle
local owners = setmetatable({}, { __mode = "k" })
M.owners = owners
local uintptr_t = ffi.typeof("uintptr_t")

local function release_handle(p)
  local key = tonumber(ffi.cast(uintptr_t, p))
  -- rawequal: another handle of the same shell (made after this one became garbage) stays
  if rawequal(handles[key], p) then handles[key] = nil end
  C.lutra_tensor_unref(p)
end

local function new_handle(t, key, owner)
  C.lutra_tensor_retain(t)
  local h = ffi.gc(t, release_handle)
  handles[key] = h
  owners[h] = owner
  return h
end

--- t: a tensor a C call returned that owner (module, quantizer, loss) owns; nil passes on.
-- @local internal: the front's files hand out owned tensors through it
function M.borrow(t, owner)
  if t == nil then return nil end
  local key = tonumber(ffi.cast(uintptr_t, t))
  local h = handles[key]
  if h ~= nil then return h end
  return new_handle(t, key, owner)
end

--- lutra.tensor(shape, dtype?, device?) -> zero-filled tensor
function M.new(shape, dtype, device)
  local where = "lutra.tensor"
  local n = fill_shape(shape, where)
  local dt = core.code(core.dtypes, dtype or "f32", "dtype", where)
  local dev = core.device(device, where)
  -- lutra_tensor_new zero-fills every dtype (i32 too)
  check(C.lutra_tensor_new(dt, n, shape_buf, dev, core.tensor_box))
  return own(core.tensor_box[0])
end

-- lutra.from_table(values, shape?, dtype?, device?): values is a flat Lua array.
local function build(values, shape, dtype, device)
  local t = M.new(shape or { #values }, dtype, device)
  t:set(values)
  return t
end

--- lutra.from_table(values, shape?, dtype?, device?): a tensor holding a flat Lua array.
--
-- @tparam table values numbers, row-major
-- @tparam[opt] table shape default {#values}
--
-- @tparam[opt] string dtype default "f32" (or "bf16", "f16", "i32")
-- @tparam[opt] string device
function M.from_table(values, shape, dtype, device)
  local ok, t = pcall(build, values, shape, dtype, device)
  if not ok then error((tostring(t):gsub("^[^:]*:%d+: ", "")), 2) end
  return t
end

local function check_live(t, where)
  if bit.band(t.flags, C.LUTRA_TENSOR_FREED) ~= 0 then error(where .. ": tensor was freed", 3) end
end

-- The largest int32 a label may be; floats are refused rather than truncated.
local I32_MIN, I32_MAX = -2 ^ 31, 2 ^ 31 - 1

--- A tensor: lutra_tensor* cdata. Its fields (shape, ndim, numel, dtype, device, ...) are read-only from Lua.
-- @type Tensor

--- values: a Lua array of numel numbers, or a sized cdata array (float[n] for float tensors,
-- int32_t[n] for i32) of at least numel elements. A bare pointer is refused: it carries no
-- length, and a short buffer behind it would be read past its end.
function Tensor:set(values)
  local where = "tensor:set"
  check_live(self, where)
  local n = tonumber(self.numel)
  local i32 = self.dtype == C.LUTRA_I32
  if type(values) == "table" then
    if #values ~= n then
      error(string.format("%s: %d values for a tensor of %d", where, #values, n), 2)
    end
    local buf = ffi.new(i32 and "int32_t[?]" or "float[?]", math.max(n, 1))
    for i = 1, n do
      local v = values[i]
      if type(v) ~= "number" then
        error(string.format("%s: value %d must be a number (got %s)", where, i, chk.got(v)), 2)
      end
      if i32 and (v ~= math.floor(v) or v < I32_MIN or v > I32_MAX) then
        error(string.format("%s: value %d must be an int32 for an i32 tensor (got %s)", where, i,
                            tostring(v)), 2)
      end
      buf[i - 1] = v
    end
    if i32 then check(C.lutra_tensor_set_i32(self, buf, n)) else check(C.lutra_tensor_set_f32(self, buf, n)) end
    return self
  end
  local elem = i32 and "int" or "float"
  local count = chk.array_count(values, elem)
  if count == nil then
    error(string.format("%s: values must be a table or a %s array (ffi.new(\"%s[?]\", n)) "
                        .. "(got %s)", where, i32 and "int32_t" or "float",
                        i32 and "int32_t" or "float", chk.got(values)), 2)
  end
  if count < n then
    error(string.format("%s: the array holds %d values, the tensor %d", where, count, n), 2)
  end
  if i32 then check(C.lutra_tensor_set_i32(self, values, n)) else check(C.lutra_tensor_set_f32(self, values, n)) end
  return self
end

--- Values as f32 (FP8 tensors dequantized): into buf, a float array (ffi.new("float[?]", n))
-- of at least numel elements, or into a new one.
function Tensor:read(buf)
  local n = tonumber(self.numel)
  if buf == nil then buf = ffi.new("float[?]", math.max(n, 1)) else
    local count = chk.array_count(buf, "float")
    if count == nil then
      error("tensor:read: buf must be a float array (ffi.new(\"float[?]\", n)) (got "
            .. chk.got(buf) .. ")", 2)
    end
    if count < n then
      error(string.format("tensor:read: buf holds %d floats, the tensor %d", count, n), 2)
    end
  end
  check(C.lutra_tensor_get_f32(self, buf, n))
  return buf
end

--- The values as a flat Lua array of numbers (f32; FP8 tensors dequantized; integers for an
-- i32 tensor). Allocates: for inspection, not for a training loop (use :read(buf) or :item()).
function Tensor:to_table()
  local n = tonumber(self.numel)
  local i32 = self.dtype == C.LUTRA_I32
  local buf = ffi.new(i32 and "int32_t[?]" or "float[?]", math.max(n, 1))
  if i32 then check(C.lutra_tensor_get_i32(self, buf, n)) else check(C.lutra_tensor_get_f32(self, buf, n)) end
  local t = {}
  for i = 1, n do t[i] = buf[i - 1] end
  return t
end

--- The value of a one-element tensor (a loss). Reuses one box: no allocation.
function Tensor:item()
  check(C.lutra_tensor_get_f32(self, core.float_box, 1))
  return core.float_box[0]
end

--- Raw bytes of the rowwise (or columnwise) data as a Lua string, e.g. FP8 codes.
function Tensor:bytes(columnwise)
  if columnwise ~= nil then chk.boolean(columnwise, "columnwise", "tensor:bytes") end
  local size = tonumber(self.numel) * tonumber(C.lutra_dtype_size(self.dtype))
  if self.dtype == C.LUTRA_E2M1 then size = tonumber(self.numel) / 2 end -- two codes a byte
  local buf = ffi.new("uint8_t[?]", size)
  check(C.lutra_tensor_get_bytes(self, columnwise and 1 or 0, buf, size))
  return ffi.string(buf, size)
end

--- Sets every element to v.
-- @tparam number v
-- @return self
function Tensor:fill(v)
  chk.number(v, "value", "tensor:fill")
  check(C.lutra_tensor_fill(self, v))
  return self
end

-- Without a seed the fill draws one from the global generator (lutra.manual_seed), so two
-- unseeded fills differ and a seeded program repeats.
local seed_box = ffi.new("uint64_t[1]")
local function next_seed()
  check(C.lutra_seed_next(seed_box))
  return seed_box[0]
end
--- The next seed of the global generator (lutra.manual_seed), for unseeded fills.
-- @local internal: for the front's files (lutra.manual_seed is the users' handle on it)
M.next_seed = next_seed

local function random_args(seed, a, b, da, db, where, na, nb)
  if seed == nil then seed = next_seed() else chk.seed(seed, "seed", where, 4) end
  if a == nil then a = da else chk.number(a, na, where, 4) end
  if b == nil then b = db else chk.number(b, nb, where, 4) end
  return seed, a, b
end

--- Fills with N(mean, std) draws (xoshiro256**, the same on every backend).
--
-- @tparam[opt] integer seed default: the next seed of the global generator (lutra.manual_seed)
--
-- @tparam[opt] number mean default 0
-- @tparam[opt] number std default 1
-- @return self
function Tensor:randn(seed, mean, std)
  seed, mean, std = random_args(seed, mean, std, 0, 1, "tensor:randn", "mean", "std")
  check(C.lutra_tensor_randn(self, seed, mean, std))
  return self
end
--- Fills with uniform draws in [lo, hi).
--
-- @tparam[opt] integer seed as :randn
-- @tparam[opt] number lo default 0
--
-- @tparam[opt] number hi default 1
-- @return self
function Tensor:uniform(seed, lo, hi)
  seed, lo, hi = random_args(seed, lo, hi, 0, 1, "tensor:uniform", "lo", "hi")
  check(C.lutra_tensor_uniform(self, seed, lo, hi))
  return self
end
--- Copies src's values into this tensor, converting dtypes (and across devices).
--
-- @param src a tensor with as many elements
-- @return self
function Tensor:copy(src)
  chk.tensor(src, "src", "tensor:copy")
  check(C.lutra_tensor_copy(self, src))
  return self
end

-- A tensor a module, quantizer or loss owns (its weight, output, gradient) is refused: the
-- owner's next call needs the shape it gave it.
local function owner_name(t)
  local o = owners[t]
  if ffi.istype("lutra_module *", o) then return "module " .. ffi.string(C.lutra_module_kind(o)) end
  if ffi.istype("lutra_loss *", o) then return "a loss" end
  if ffi.istype("lutra_quantizer *", o) then return "a quantizer" end
  return "a module, quantizer or loss"
end

--- Changes the shape in place (same element count, up to 4 dims). Refused for a tensor a module,
-- quantizer or loss owns (its weight, output or gradient): copy it into a tensor of your own.
-- @tparam table shape
-- @return self
function Tensor:reshape(shape)
  local n = fill_shape(shape, "tensor:reshape")
  local flags = self.flags
  if bit.band(flags, C.LUTRA_TENSOR_BORROWED) ~= 0 and bit.band(flags, C.LUTRA_TENSOR_FREED) == 0 then
    error("tensor:reshape: the tensor is owned by " .. owner_name(self) .. ", whose next call " ..
          "needs its shape; copy it first (lutra.tensor(shape):copy(t))", 2)
  end
  check(C.lutra_tensor_reshape(self, n, shape_buf))
  return self
end
--- The largest absolute value (NaNs ignored), as FP8 scaling sees it.
-- Named absmax, not amax: the struct's amax field would hide a method of that name.
--
-- @treturn number
function Tensor:absmax()
  check(C.lutra_tensor_amax(self, core.float_box))
  return core.float_box[0]
end

--- The shape as a Lua array, e.g. {128, 64}.
-- Named dims, not shape: the struct's own shape field would hide a method of that name.
function Tensor:dims()
  local s = {}
  for i = 0, self.ndim - 1 do s[i + 1] = tonumber(self.shape[i]) end
  return s
end
--- The number of elements.
function Tensor:size() return tonumber(self.numel) end
--- "f32", "bf16", "f16", "e4m3", "e5m2", "e8m0" or "i32".
function Tensor:dtype_name() return dtype_names[tonumber(self.dtype)] end
--- "cpu" or "cuda".
function Tensor:device_name() return device_names[tonumber(self.device)] end
--- How an FP8 tensor is scaled: "none", "tensor", "mxfp8", "block_1d" or "block_2d".
function Tensor:scaling_name() return scaling_names[tonumber(self.scaling)] end
--- True once the tensor (or the module that owns it) was freed, or its buffer replaced.
function Tensor:is_freed() return bit.band(self.flags, C.LUTRA_TENSOR_FREED) ~= 0 end

--- Frees the buffers now; the handle stays and every later call on it is an error.
function Tensor:destroy()
  check(C.lutra_tensor_destroy(self))
end

local function tostring_tensor(t)
  if t:is_freed() then return "lutra.tensor(freed)" end
  return string.format("lutra.tensor(%s, %s, %s%s)", table.concat(t:dims(), "x"),
                       t:dtype_name(), t:device_name(),
                       t.scaling ~= 0 and (", " .. t:scaling_name()) or "")
end

-- The struct's fields are const in the cdef (lutra.h's LUTRA_LUA_RO): a write such as
-- x.numel = 512 raises LuaJIT's "attempt to write to constant location" instead of letting the
-- next call read past the allocation. Chosen over checking numel against the allocation in C
-- because it also covers data, shape, dtype and the scale pointers, which C cannot verify.
-- Keys that are no field land here.
local function newindex(_, k)
  error(string.format("lutra.tensor: cannot set '%s' (a tensor's fields are read-only)",
                      tostring(k)), 2)
end

ffi.metatype("lutra_tensor", { __index = Tensor, __newindex = newindex,
                               __tostring = tostring_tensor })

M.Tensor = Tensor
M.dtype_names = dtype_names
-- add_, scale_, rows, select, argmax, softmax, sample (lua/lutra/tensor_ops.lua)
require("lutra.tensor_ops").install(Tensor, M.new)
return M

--- Tensors over memory the caller owns (lutra.wrap) (src/lutra/wrap.h): an FFI array or a pointer.
--   local buf = ffi.new("float[?]", 64 * 32)
--   local x = lutra.wrap(buf, {64, 32})           -- f32 on the default device
--   net:forward(x); out:copy(y)                    -- in place, no allocation
-- lutra.wrap(cdata, shape, dtype = "f32", {device =, bytes =}): cdata is an FFI array (its size
-- is checked against the shape, and the tensor's handle keeps it alive) or a pointer (to host
-- memory, or to device memory with device = "cuda"; bytes, when given, is checked against the
-- shape; the caller keeps the memory alive). lutra never frees the buffer. Once the handle is
-- collected or :destroy()d, a module still holding the tensor as its saved input refuses its
-- backward ("was freed") instead of reading a buffer that may be gone.
-- @module lutra.wrap
local core = require("lutra.core")
local chk = require("lutra.check")
local ffi, C, check = core.ffi, core.C, core.check

local M = {}
local shape_buf = ffi.new("int64_t[4]")
local box = ffi.new("lutra_tensor*[1]")
local uintptr_t = ffi.typeof("uintptr_t")

-- the arrays behind wrapped tensors, by the tensor's address: a strong reference that the
-- tensor's finalizer drops only after marking the tensor freed, so that the array cannot be
-- collected while the tensor can still be used
local arrays = {}

local function release(t)
  local key = tonumber(ffi.cast(uintptr_t, t))
  C.lutra_tensor_destroy(t) -- marks it freed for a module that still holds it
  C.lutra_tensor_unref(t)
  arrays[key] = nil
end

local function kind_of(v)
  local name = tostring(ffi.typeof(v))
  if name:match("%[[%d?]*%]>$") then return "array" end
  if name:match("%*>$") then return "pointer" end
  return nil
end

--- lutra.wrap: a tensor over cdata's memory, without a copy; lutra never frees the memory.
-- @param cdata an FFI array (its size is checked against the shape; the tensor keeps it alive)
-- or a pointer (host memory, or device memory with device = "cuda"; the caller keeps it alive)
-- @tparam table shape 1 to 4 dims
-- @tparam[opt] string dtype "f32" (the default), "bf16", "f16", "i32", ...
-- @tparam[opt] table opts {device =, bytes =}: bytes, for a pointer, is checked against the
-- shape
-- @return the tensor (:destroy() or the GC drops it; the memory stays the caller's)
function M.wrap(cdata, shape, dtype, opts)
  local where = "lutra.wrap"
  opts = core.check_options(opts, { device = true, bytes = true }, where)
  local kind = type(cdata) == "cdata" and kind_of(cdata) or nil
  if not kind then
    error(string.format("%s: data must be an FFI array or pointer (got %s)", where,
                        chk.got(cdata)), 2)
  end
  if type(shape) ~= "table" or #shape < 1 or #shape > 4 then
    error(where .. ": shape must be a table of 1 to 4 dims", 2)
  end
  for i = 1, #shape do shape_buf[i - 1] = chk.integer(shape[i], "dim " .. i, where, nil, 2 ^ 53) end
  local code = core.code(core.dtypes, dtype or "f32", "dtype", where)
  local device = core.device(opts.device, where)
  local bytes
  if kind == "array" then
    bytes = ffi.sizeof(cdata)
    if opts.bytes ~= nil then error(where .. ": bytes is for pointers (an array has its size)", 2) end
  elseif opts.bytes ~= nil then
    bytes = chk.integer(opts.bytes, "bytes", where, 0, 2 ^ 53)
  else
    -- a pointer without a size: the caller vouches for the shape's byte count
    bytes = ffi.cast("size_t", -1)
  end
  check(C.lutra_tensor_wrap(ffi.cast("void *", cdata), code, #shape, shape_buf, device, bytes, box))
  local t = box[0]
  if kind == "array" then arrays[tonumber(ffi.cast(uintptr_t, t))] = cdata end
  return ffi.gc(t, release)
end

return M

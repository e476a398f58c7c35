-- Tensors: lutra_tensor* cdata with methods. Tensors made here are owned by Lua (freed by the
-- GC or by :free()); tensors returned by modules and quantizers are owned by them.
local core = require("lutra.core")
local ffi, C, check = core.ffi, core.C, core.check

local M = {}
local Tensor = {}
Tensor.__index = Tensor

local dtype_names = {}
for name, code in pairs(core.dtypes) do dtype_names[tonumber(code)] = name end
local device_names = {}
for name, code in pairs(core.devices) do device_names[tonumber(code)] = name end
local scaling_names = { [0] = "none", "tensor", "mxfp8", "block_1d", "block_2d" }

local shape_buf = ffi.new("int64_t[4]")

local function fill_shape(shape, where)
  if type(shape) ~= "table" then error(where .. ": shape must be a table of dims", 3) end
  local n = #shape
  if n < 1 or n > 4 then error(where .. ": shape must have 1 to 4 dims", 3) end
  for i = 1, n do
    local d = shape[i]
    if type(d) ~= "number" or d ~= math.floor(d) then
      error(string.format("%s: dim %d is not an integer", where, i), 3)
    end
    shape_buf[i - 1] = d
  end
  return n
end

local function own(t)
  return ffi.gc(t, C.lutra_tensor_free)
end

-- lutra.tensor(shape, dtype?, device?) -> zero-filled tensor
function M.new(shape, dtype, device)
  local where = "lutra.tensor"
  local n = fill_shape(shape, where)
  local dt = core.code(core.dtypes, dtype or "f32", "dtype", where)
  local dev = core.device(device, where)
  check(C.lutra_tensor_new(dt, n, shape_buf, dev, core.tensor_box))
  local t = own(core.tensor_box[0])
  if dt ~= C.LUTRA_I32 then check(C.lutra_tensor_fill(t, 0)) end
  return t
end

-- lutra.from_table(values, shape?, dtype?, device?): values is a flat Lua array.
local function build(values, shape, dtype, device)
  local t = M.new(shape or { #values }, dtype, device)
  t:set(values)
  return t
end

function M.from_table(values, shape, dtype, device)
  local ok, t = pcall(build, values, shape, dtype, device)
  if not ok then error((tostring(t):gsub("^[^:]*:%d+: ", "")), 2) end
  return t
end

function Tensor:set(values)
  if bit.band(self.flags, C.LUTRA_TENSOR_FREED) ~= 0 then error("tensor:set: tensor was freed", 2) end
  local n = tonumber(self.numel)
  if type(values) == "table" then
    if #values ~= n then
      error(string.format("tensor:set: %d values for a tensor of %d", #values, n), 2)
    end
    if self.dtype == C.LUTRA_I32 then
      local buf = ffi.new("int32_t[?]", n)
      for i = 1, n do buf[i - 1] = values[i] end
      check(C.lutra_tensor_set_i32(self, buf, n))
    else
      local buf = ffi.new("float[?]", n)
      for i = 1, n do buf[i - 1] = values[i] end
      check(C.lutra_tensor_set_f32(self, buf, n))
    end
  else -- a float* / int32_t* cdata of numel values
    if self.dtype == C.LUTRA_I32 then
      check(C.lutra_tensor_set_i32(self, values, n))
    else
      check(C.lutra_tensor_set_f32(self, values, n))
    end
  end
  return self
end

-- Values as f32 (FP8 tensors dequantized): into a float[numel] cdata, or a new Lua array.
function Tensor:read(buf)
  local n = tonumber(self.numel)
  local out = buf or ffi.new("float[?]", n)
  check(C.lutra_tensor_get_f32(self, out, n))
  return out
end

function Tensor:to_table()
  local n = tonumber(self.numel)
  local buf = ffi.new("float[?]", math.max(n, 1))
  check(C.lutra_tensor_get_f32(self, buf, n))
  local t = {}
  for i = 1, n do t[i] = buf[i - 1] end
  return t
end

-- The value of a one-element tensor (a loss). Reuses one box: no allocation.
function Tensor:item()
  check(C.lutra_tensor_get_f32(self, core.float_box, 1))
  return core.float_box[0]
end

-- Raw bytes of the rowwise (or columnwise) data as a Lua string, e.g. FP8 codes.
function Tensor:bytes(columnwise)
  local size = tonumber(self.numel) * tonumber(C.lutra_dtype_size(self.dtype))
  local buf = ffi.new("uint8_t[?]", size)
  check(C.lutra_tensor_get_bytes(self, columnwise and 1 or 0, buf, size))
  return ffi.string(buf, size)
end

function Tensor:fill(v) check(C.lutra_tensor_fill(self, v)) return self end
function Tensor:randn(seed, mean, std)
  check(C.lutra_tensor_randn(self, seed or 0, mean or 0, std or 1))
  return self
end
function Tensor:uniform(seed, lo, hi)
  check(C.lutra_tensor_uniform(self, seed or 0, lo or 0, hi or 1))
  return self
end
function Tensor:copy(src) check(C.lutra_tensor_copy(self, src)) return self end
function Tensor:reshape(shape)
  local n = fill_shape(shape, "tensor:reshape")
  check(C.lutra_tensor_reshape(self, n, shape_buf))
  return self
end
-- (not :amax(): the struct's amax field would hide a method of that name)
function Tensor:absmax()
  check(C.lutra_tensor_amax(self, core.float_box))
  return core.float_box[0]
end

-- (named dims, not shape: the struct's own shape field would hide a method of that name)
function Tensor:dims()
  local s = {}
  for i = 0, self.ndim - 1 do s[i + 1] = tonumber(self.shape[i]) end
  return s
end
function Tensor:size() return tonumber(self.numel) end
function Tensor:dtype_name() return dtype_names[tonumber(self.dtype)] end
function Tensor:device_name() return device_names[tonumber(self.device)] end
function Tensor:scaling_name() return scaling_names[tonumber(self.scaling)] end
function Tensor:is_freed() return bit.band(self.flags, C.LUTRA_TENSOR_FREED) ~= 0 end

-- Frees the buffers now; the handle stays and every later call on it is an error.
function Tensor:free()
  check(C.lutra_tensor_release(self))
end

local function tostring_tensor(t)
  if t:is_freed() then return "lutra.tensor(freed)" end
  return string.format("lutra.tensor(%s, %s, %s%s)", table.concat(t:dims(), "x"),
                       t:dtype_name(), t:device_name(),
                       t.scaling ~= 0 and (", " .. t:scaling_name()) or "")
end

ffi.metatype("lutra_tensor", { __index = Tensor, __tostring = tostring_tensor })

M.Tensor = Tensor
M.dtype_names = dtype_names
return M

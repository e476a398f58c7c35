-- Reading and editing safetensors files byte by byte, and the trained model they hold, for the
-- checkpoint specs that build bad files (spec/checkpoint_spec.lua,
-- spec/checkpoint_values_spec.lua, spec/checkpoint_bad_input_spec.lua).
local ffi = require("ffi")
local lutra = require("lutra")
local M = {}

-- the specs' model: 32 -> 64 -> 16 with a GELU between
function M.mlp(opts)
  local nn = lutra.nn
  return nn.Sequential(nn.Linear(32, 64, opts), nn.GELU(), nn.Linear(64, 16, opts))
end

-- M.mlp trained 2 steps under delayed scaling (amax_history_len 4) with AdamW, from the
-- generator seeded with seed, so that every part of a checkpoint has non-trivial state
function M.trained(seed, dtype)
  lutra.manual_seed(seed)
  local net = M.mlp { dtype = dtype }
  local opt = lutra.optim.AdamW(net, { lr = 1e-2 })
  local scope = lutra.autocast { recipe = lutra.recipe.delayed { amax_history_len = 4 } }
  local x, t = lutra.tensor({ 16, 32 }, dtype), lutra.tensor({ 16, 16 }, dtype)
  local loss = lutra.nn.MSELoss()
  for _ = 1, 2 do
    x:randn()
    t:randn()
    scope:enter()
    loss:forward(net:forward(x), t)
    net:backward(loss:backward())
    scope:exit()
    opt:step()
  end
  return net, opt
end

M.read = require("spec.support.resume").read

function M.write(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

function M.le64(n)
  local t = {}
  for i = 1, 8 do
    t[i] = string.char(n % 256)
    n = math.floor(n / 256)
  end
  return table.concat(t)
end

-- the JSON header of a safetensors file, and the data after it
function M.split(bytes)
  local n = 0
  for i = 8, 1, -1 do n = n * 256 + bytes:byte(i) end
  return bytes:sub(9, 8 + n), bytes:sub(9 + n)
end

function M.join(header, data) return M.le64(#header) .. header .. data end

-- the data offsets [begin, end) of tensor name in header
function M.offsets(header, name)
  local quoted = '"' .. name:gsub("%p", "%%%0") .. '"'
  local b, e = header:match(quoted .. ':{[^}]-"data_offsets":%[(%d+),(%d+)%]')
  assert(b, "no tensor " .. name .. " in the header")
  return tonumber(b), tonumber(e)
end

-- data with tensor name's bytes replaced by bytes (of the same length)
function M.patch(header, data, name, bytes)
  local b, e = M.offsets(header, name)
  assert(e - b == #bytes, "patch of " .. name .. " has the wrong length")
  return data:sub(1, b) .. bytes .. data:sub(e + 1)
end

-- f32 values as little-endian bytes, and back
function M.f32(...)
  local v = { ... }
  local buf = ffi.new("float[?]", #v, v)
  return ffi.string(buf, 4 * #v)
end

function M.f32_at(header, data, name, i)
  local b = M.offsets(header, name)
  local buf = ffi.new("float[1]")
  ffi.copy(buf, data:sub(b + 1 + 4 * i, b + 4 + 4 * i), 4)
  return buf[0]
end

-- a header whose __metadata__ value of key is replaced (the key must be there)
function M.set_meta(header, key, value)
  local quoted = '"' .. key:gsub("%p", "%%%0") .. '":"[^"]*"'
  local new, n = header:gsub(quoted, function() return '"' .. key .. '":"' .. value .. '"' end, 1)
  assert(n == 1, "no __metadata__ key " .. key)
  return new
end

-- a fresh directory, removed by the caller (os.execute("rm -rf " .. dir)); in memory
-- (/dev/shm) when there is one and in_memory is set: specs that save thousands of times then
-- spend no time in fsync
function M.tempdir(in_memory)
  local dir = os.tmpname()
  os.remove(dir)
  if in_memory and os.execute("test -d /dev/shm -a -w /dev/shm") == 0 then
    dir = "/dev/shm/" .. dir:match("[^/]+$")
  end
  assert(os.execute("mkdir -p " .. dir) == 0)
  return dir
end

return M

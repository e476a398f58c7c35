-- Reading FP8 tensors back as bytes, for specs that compare them bit for bit: codes, the raw
-- scale arrays (the API has no call for them: they are read through a borrowed 1-D view of the
-- buffer, an ffi-made lutra_tensor that nothing frees, with lutra_tensor_get_bytes), and a
-- snapshot of everything a quantization may write. Not a spec itself (no _spec in its name).
local lutra = require("lutra")
local ffi = require("ffi")
local C = lutra.C

local M = {}

local function fail(fmt, ...) error(string.format(fmt, ...), 3) end

-- byte strings equal, else the count of differing bytes and the first one
function M.same_bytes(got, want, what)
  if got == want then return end
  if #got ~= #want then fail("%s: %d bytes, expected %d", what, #got, #want) end
  local count, first = 0, nil
  for i = 1, #want do
    if got:byte(i) ~= want:byte(i) then count, first = count + 1, first or i end
  end
  fail("%s: %d of %d bytes differ, the first at byte %d", what, count, #want, first - 1)
end

-- count elements of dtype at ptr (backend memory of device) as bytes; the owner must be alive
function M.view_bytes(ptr, count, dtype, device)
  assert(ptr ~= nil, "view_bytes: NULL pointer")
  -- the fields are const to Lua (lutra.h's LUTRA_LUA_RO): set them through the initializer
  local v = ffi.new("lutra_tensor", { data = ptr, shape = { count }, numel = count, ndim = 1,
                                      dtype = dtype, device = device,
                                      flags = C.LUTRA_TENSOR_BORROWED })
  return v:bytes(false)
end

local function round4(n) return math.ceil(n / 4) * 4 end

-- The raw scale array of one copy of a 2-D FP8 (or NVFP4) tensor t, per lutra.h's layouts (block
-- scaling's zero padding included), and its element size. Rowwise scaling: one f32 per row of the
-- copy; NVFP4 (lutra/nvfp4.h): the E4M3 block scales padded to 16 bytes, then the copy's decode
-- scale and amax (an f32 each).
function M.scale_bytes(t, columnwise)
  local dims = t:dims()
  local r, c = dims[1], dims[2]
  if columnwise then r, c = c, r end
  local sc, count, dt = t:scaling_name(), nil, C.LUTRA_F32
  if sc == "tensor" then
    count = 1
  elseif sc == "mxfp8" then
    count, dt = r * math.ceil(c / 32), C.LUTRA_E8M0
  elseif sc == "block_1d" then
    count = math.ceil(c / 128) * round4(r)
  elseif sc == "rowwise" then
    count = r
  elseif sc == "nvfp4" then
    count, dt = math.ceil(r * c / 16 / 16) * 16 + 16, C.LUTRA_E4M3
  else
    assert(sc == "block_2d", "unknown scaling " .. tostring(sc))
    count = math.ceil(r / 128) * round4(math.ceil(c / 128))
  end
  local p = columnwise and t.col_scale_inv or t.scale_inv
  return M.view_bytes(p, count, dt, t.device), dt == C.LUTRA_F32 and 4 or 1
end

-- Everything a quantization may write: both copies' codes and scale arrays, the tensor's amax,
-- the quantizer's scale (cfg.tensor: per-tensor recipes) and amax history (cfg.delayed).
function M.snapshot(q, t, cfg)
  local s = { row = t:bytes(false), col = t:bytes(true), row_scales = (M.scale_bytes(t, false)),
              col_scales = (M.scale_bytes(t, true)) }
  if t.amax ~= nil then s.amax = M.view_bytes(t.amax, 1, C.LUTRA_F32, t.device) end
  if cfg.tensor then
    local sc, si = q:scale()
    s.scale = string.format("%a %a", sc, si)
  end
  if cfg.delayed then s.history = table.concat(q:history(4), " ") end
  return s
end

function M.same_snapshot(got, want, what)
  for k, v in pairs(want) do
    if got[k] == nil then fail("%s: %s missing", what, k) end
    M.same_bytes(got[k], v, what .. ": " .. k)
  end
end

return M

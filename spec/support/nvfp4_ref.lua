-- An independent reference of NVFP4 quantization (lutra/nvfp4.h) for the specs: E2M1 rounding
-- by nearest grid value in FP64 (ties to the even code), f32 arithmetic emulated by rounding each
-- double result to f32 (exact for one +, *, / of f32 operands), splitmix64 in uint64 cdata.
-- E4M3 goes through lutra_encode / lutra_decode (spec/native/check_codecs.cu checks those against
-- cuda_fp8.h).
local ffi = require("ffi")
local bit = require("bit")
local C = require("lutra").C

local M = {}

local r32 = require("spec.support.f32")
M.r32 = r32

local FLT_MAX = 3.4028234663852886e38
M.GRID = { [0] = 0, 0.5, 1, 1.5, 2, 3, 4, 6 }
local GRID = M.GRID

-- E2M1 code of v: round to nearest, ties to even, saturating, NaN -> 7
function M.e2m1(v)
  if v ~= v then return 7 end
  local sign = (v < 0 or (v == 0 and 1 / v < 0)) and 8 or 0
  local a = math.abs(v)
  if a >= 6 then return sign + 7 end
  local best, bd = 0, math.huge
  for c = 0, 7 do
    local d = math.abs(a - GRID[c])
    if d < bd or (d == bd and c % 2 == 0) then best, bd = c, d end
  end
  return sign + best
end

function M.e2m1_value(c)
  local v = GRID[c % 8]
  return c >= 8 and -v or v
end

local GOLDEN, COL = 0x9E3779B97F4A7C15ULL, 0xD1B54A32D192ED03ULL
local function mix(z)
  z = bit.bxor(z, bit.rshift(z, 30)) * 0xBF58476D1CE4E5B9ULL
  z = bit.bxor(z, bit.rshift(z, 27)) * 0x94D049BB133111EBULL
  return bit.bxor(z, bit.rshift(z, 31))
end
function M.call_seed(seed, n) return mix(ffi.cast("uint64_t", seed) + ffi.cast("uint64_t", n) * GOLDEN) end
local function random24(seed, stream, index)
  return tonumber(bit.rshift(mix(bit.bxor(seed, stream) + (ffi.cast("uint64_t", index) + 1) * GOLDEN), 40))
end

-- E2M1 code of v with stochastic rounding by r (24 bits)
function M.e2m1_sr(v, r)
  if v ~= v then return 7 end
  local sign = (v < 0 or (v == 0 and 1 / v < 0)) and 8 or 0
  local a = math.abs(v)
  if a >= 6 then return sign + 7 end
  local lo = 0
  while lo < 6 and GRID[lo + 1] <= a do lo = lo + 1 end
  local frac = (a - GRID[lo]) / (GRID[lo + 1] - GRID[lo])
  return sign + ((r / 16777216 < frac) and lo + 1 or lo)
end

local function global_encode(amax)
  local s = r32(2688 / amax)
  if s > FLT_MAX then s = FLT_MAX end
  if amax == 0 or s == 0 then return 1 end
  return s
end

-- TE's orders: block scale e4m3(min(bmax * (ge * (1/6)), FLT_MAX)), block encode
-- min(1 / (scale * (1 / ge)), FLT_MAX)
local SIXTH = r32(1 / 6)
local function block_scale(bmax, ge)
  return C.lutra_encode(C.LUTRA_E4M3, math.min(r32(bmax * r32(ge * SIXTH)), FLT_MAX))
end
local function block_encode(sc, ge)
  local p = r32(C.lutra_decode(C.LUTRA_E4M3, sc) * r32(1 / ge))
  return math.min(r32(1 / p), FLT_MAX)
end

-- the 16-point RHT of lutra/nvfp4.h on a Lua array (1-based, 16 values) in emulated f32
function M.rht16(x, signs)
  local t, y = {}, {}
  for i = 0, 15 do t[i] = bit.band(bit.rshift(signs, i), 1) == 1 and -x[i + 1] or x[i + 1] end
  for j = 0, 15 do
    local acc = 0
    for i = 0, 15 do
      local odd = bit.band(M.popcount(bit.band(i, j)), 1) == 1
      acc = r32(odd and acc - t[i] or acc + t[i])
    end
    y[j + 1] = r32(acc * 0.25)
  end
  return y
end
function M.popcount(v)
  local n = 0
  while v ~= 0 do n, v = n + bit.band(v, 1), bit.rshift(v, 1) end
  return n
end

-- One copy: lines[l] a Lua array of len values (len a multiple of 16), 1x16 blocks, or 16x16
-- tiles when tiles is true. opts: {sr = seed of this call or nil, stream = 0 or "col"}.
-- Returns codes (0-based array over the copy), block scale codes [l * nb + b] and the decode scale.
function M.copy(lines, opts)
  opts = opts or {}
  local n, len = #lines, #lines[1]
  local nb = len / 16
  local amax = 0
  for l = 1, n do for k = 1, len do amax = math.max(amax, math.abs(lines[l][k])) end end
  local ge = global_encode(amax)
  local codes, scales = {}, {}
  local stream = opts.stream == "col" and COL or 0ULL
  for l = 1, n do
    for b = 0, nb - 1 do
      local bmax = 0
      if opts.tiles then
        local t0 = math.floor((l - 1) / 16) * 16
        for l2 = t0 + 1, t0 + 16 do
          for k = b * 16 + 1, b * 16 + 16 do bmax = math.max(bmax, math.abs(lines[l2][k])) end
        end
      else
        for k = b * 16 + 1, b * 16 + 16 do bmax = math.max(bmax, math.abs(lines[l][k])) end
      end
      local sc = block_scale(bmax, ge)
      scales[(l - 1) * nb + b] = sc
      local enc = block_encode(sc, ge)
      for k = b * 16 + 1, b * 16 + 16 do
        local idx = (l - 1) * len + k - 1
        local v = r32(lines[l][k] * enc)
        codes[idx] = opts.sr and M.e2m1_sr(v, random24(opts.sr, stream, idx)) or M.e2m1(v)
      end
    end
  end
  return codes, scales, r32(1 / ge)
end

-- codes (0-based, even count) packed two per byte, low nibble first, as a string
function M.pack(codes, count)
  local bytes = {}
  for i = 0, count - 1, 2 do bytes[#bytes + 1] = string.char(codes[i] + 16 * codes[i + 1]) end
  return table.concat(bytes)
end

-- the block scale codes and the decode scale a tensor's scale array holds for one copy
function M.read_scales(ptr, lines, len)
  local p = ffi.cast("const uint8_t*", ptr)
  local nb = len / 16
  local sc = {}
  for i = 0, lines * nb - 1 do sc[i] = p[i] end
  local off = math.ceil(lines * nb / 16) * 16
  return sc, ffi.cast("const float*", p + off)[0]
end

-- x (a Lua array, row-major [rows, cols]) as rows, and as columns (the columnwise copy's lines)
local function lines_of(v, rows, cols, columnwise)
  local n, len = rows, cols
  if columnwise then n, len = cols, rows end
  local out = {}
  for a = 1, n do
    local line = {}
    for b = 1, len do
      local r, c = a, b
      if columnwise then r, c = b, a end
      line[b] = v[(r - 1) * cols + c]
    end
    out[a] = line
  end
  return out
end
function M.rows_of(v, rows, cols) return lines_of(v, rows, cols, false) end
function M.cols_of(v, rows, cols) return lines_of(v, rows, cols, true) end

-- lines with the RHT applied to each 16 values
function M.rht_lines(lines, signs)
  local out = {}
  for l, line in ipairs(lines) do
    local t = {}
    for b = 0, #line / 16 - 1 do
      local y = M.rht16({ unpack(line, b * 16 + 1, b * 16 + 16) }, signs)
      for i = 1, 16 do t[b * 16 + i] = y[i] end
    end
    out[l] = t
  end
  return out
end

return M

-- Plain Lua references of the MoE routing ops (src/lutra/moe.h), for spec/moe_spec.lua and
-- spec/gpu/moe_gpu.lua. Arrays are flat Lua arrays (1-based); expert indices are 0-based as
-- the library's. Not a spec itself (no _spec in its name).
local ffi = require("ffi")

local R = {}

-- the values of an i32 tensor as a Lua array
function R.ints(t)
  local s = t:bytes()
  local p = ffi.cast("const int32_t*", s)
  local out = {}
  for i = 0, #s / 4 - 1 do out[i + 1] = p[i] end
  return out
end

local f32 = require("spec.support.f32")
R.f32 = f32

local function key(v) return v ~= v and -math.huge or v end

-- the k experts of each token by (logit descending, index ascending), NaN as -inf
function R.topk_indices(logits, T, E, k)
  local idx = {}
  for t = 0, T - 1 do
    local order = {}
    for j = 0, E - 1 do order[j + 1] = j end
    table.sort(order, function(a, b)
      local va, vb = key(logits[t * E + a + 1]), key(logits[t * E + b + 1])
      if va ~= vb then return va > vb end
      return a < b
    end)
    for i = 1, k do idx[t * k + i] = order[i] end
  end
  return idx
end

-- probabilities at given indices, in f64; round_diff: the logit differences rounded to f32
-- as the library forms them (else exact f64, for finite differences)
function R.topk_probs(logits, idx, T, E, k, renorm, scale, round_diff)
  local probs = {}
  for t = 0, T - 1 do
    local mx = -math.huge
    for i = 1, k do mx = math.max(mx, key(logits[t * E + idx[t * k + i] + 1])) end
    local function ex(v)
      local d = key(v) - mx
      return math.exp(round_diff and f32(d) or d)
    end
    local sum = 0
    if renorm then
      for i = 1, k do sum = sum + ex(logits[t * E + idx[t * k + i] + 1]) end
    else
      for j = 1, E do sum = sum + ex(logits[t * E + j]) end
    end
    for i = 1, k do probs[t * k + i] = ex(logits[t * E + idx[t * k + i] + 1]) / sum * scale end
  end
  return probs
end

-- row_map (0-based rows) and m_splits of a stable counting sort of the slots by expert
function R.permute_map(indices, slots, E)
  local splits = {}
  for e = 1, E do splits[e] = 0 end
  for s = 1, slots do splits[indices[s] + 1] = splits[indices[s] + 1] + 1 end
  local next_row, off = {}, 0
  for e = 1, E do
    next_row[e] = off
    off = off + splits[e]
  end
  local row_map = {}
  for s = 1, slots do
    local e = indices[s] + 1
    row_map[s] = next_row[e]
    next_row[e] = next_row[e] + 1
  end
  return row_map, splits
end

-- y[t] = sum_i p[t, i] x[row_map[t k + i]] in f64 (x: [T k, H] flat)
function R.unpermute(xe, probs, row_map, T, k, H)
  local y = {}
  for t = 0, T - 1 do
    for h = 1, H do
      local acc = 0
      for i = 1, k do acc = acc + probs[t * k + i] * xe[row_map[t * k + i] * H + h] end
      y[t * H + h] = acc
    end
  end
  return y
end

-- deterministic "random" numbers in [-1, 1) from a seed (Lua's own generator is not used so
-- that the specs do not depend on its state)
function R.noise(n, seed)
  local out, s = {}, seed
  for i = 1, n do
    s = (s * 1103515245 + 12345) % 2147483648
    out[i] = s / 1073741824 - 1
  end
  return out
end

-- n indices in [0, E) from a seed
function R.random_indices(n, E, seed)
  local v = R.noise(n, seed)
  local out = {}
  for i = 1, n do out[i] = math.min(E - 1, math.floor((v[i] + 1) / 2 * E)) end
  return out
end

return R

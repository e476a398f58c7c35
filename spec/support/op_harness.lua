-- A table-driven harness for GPU op checks, in the style of ggml's test-backend-ops: each case
-- runs on the device under test and on the CPU backend (the bit-exact reference, checked against
-- the format definitions by the CPU specs) with the same fresh inputs, and their outputs are
-- compared. A case is
--   { name = "copy", params = { from = "f32", to = "bf16" },   -- both shown in the test name
--     inputs = function(device, p) return { x = tensor, ... } end,  -- optional
--     run = function(device, inputs, p) return { label = output, ... } end,
--     compare = mode or function(label) return mode end,         -- default "bytes"
--     inputs_compare = mode,   -- how the inputs of both devices must agree (default "bytes")
--     check = function(got, want, inputs_dev, inputs_ref, p) end, -- optional, after compare
--     needs = "cuda" }         -- optional: skipped, with a message, on any other device
-- inputs() is called once per device and must build the same values on both (randn from a seed,
-- set from a host buffer); the harness compares them before running, so a case cannot pass on
-- inputs that differ. run() makes its outputs itself: tensors it allocates must be poisoned
-- (S.poisoned: NaN) so that an element a kernel forgets to write cannot match. The reference
-- runs first, then the device.
--
-- Outputs, by label (compared in sorted order): tensors, byte strings (H.blob(bytes, dtype code)
-- names the element type for the message), numbers and arrays of numbers. Modes:
--   "bytes"     identical bits (tensors: dims, dtype and bytes; numbers: bits, NaN as NaN)
--   "bits_nan"  identical bits, except that a NaN only has to be a NaN (float tensors/blobs)
--   { nmse = b, max_abs = a }  float tensors: NMSE = ||dev - ref||^2 / ||ref||^2 <= b and/or
--               every |dev - ref| <= a; every element must be finite
-- Not a spec itself (no _spec or _gpu in its name).
local lutra = require("lutra")
local ffi = require("ffi")
local S = require("spec.gpu.support")
local C = lutra.C

local H = {}
local DEV, REF = S.DEV, S.REF

-- a byte string with its element type (a LUTRA_* dtype code), so a failure names the element
local blob_mt = {}
function H.blob(bytes, code) return setmetatable({ bytes = bytes, code = code }, blob_mt) end
-- a float* of n f32 values as a blob
function H.f32_blob(ptr, n) return H.blob(ffi.string(ptr, n * 4), C.LUTRA_F32) end

local function is_tensor(v)
  return type(v) == "cdata" and (ffi.istype("lutra_tensor*", v) or ffi.istype("lutra_tensor", v))
end
H.is_tensor = is_tensor

local function same_number(a, b)
  if a ~= a then return b ~= b end
  return a == b and (a ~= 0 or 1 / a == 1 / b)
end

local function fmt_value(v)
  if type(v) == "table" then
    local t = {}
    for i = 1, #v do t[i] = fmt_value(v[i]) end
    return "{" .. table.concat(t, ", ") .. "}"
  elseif type(v) == "number" then
    return string.format("%.9g", v)
  end
  return tostring(v)
end

-- one output of both devices under a mode; what names it in a failure
local function compare_one(got, want, mode, what)
  if type(mode) == "table" then
    assert(is_tensor(want), what .. ": an NMSE comparison needs tensors")
    return S.assert_nmse(got, want, mode.nmse, what, mode.max_abs)
  end
  assert(mode == "bytes" or mode == "bits_nan", what .. ": unknown compare mode " .. tostring(mode))
  if is_tensor(want) then
    S.same_meta(got, want, what)
    if mode == "bits_nan" then
      return S.assert_same_bits_nan(got:bytes(), want:bytes(), want.dtype, what)
    end
    return S.assert_same_bytes(got:bytes(), want:bytes(), what,
                               tonumber(C.lutra_dtype_size(want.dtype)), want.dtype)
  elseif getmetatable(want) == blob_mt then
    if mode == "bits_nan" then return S.assert_same_bits_nan(got.bytes, want.bytes, want.code, what) end
    return S.assert_same_bytes(got.bytes, want.bytes, what,
                               want.code and tonumber(C.lutra_dtype_size(want.code)) or 1, want.code)
  elseif type(want) == "string" then
    return S.assert_same_bytes(got, want, what)
  elseif type(want) == "number" then
    if not same_number(got, want) then
      S.fail("%s: %s on %s, reference %s", what, fmt_value(got), DEV, fmt_value(want))
    end
  elseif type(want) == "table" then
    if type(got) ~= "table" or #got ~= #want then
      S.fail("%s: %s on %s, reference %s", what, fmt_value(got), DEV, fmt_value(want))
    end
    for i = 1, #want do
      if not same_number(got[i], want[i]) then
        S.fail("%s: element %d is %s on %s, reference %s (all: %s vs %s)", what, i - 1,
               fmt_value(got[i]), DEV, fmt_value(want[i]), fmt_value(got), fmt_value(want))
      end
    end
  else
    S.fail("%s: cannot compare a %s output", what, type(want))
  end
end
H.compare_one = compare_one

local function sorted_keys(t, what)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys)
  return keys
end

-- got and want: output maps of both devices; every label of either must be in both
function H.compare(got, want, compare, what)
  for _, k in ipairs(sorted_keys(got)) do
    if want[k] == nil then S.fail("%s: output %q only on %s", what, k, DEV) end
  end
  for _, k in ipairs(sorted_keys(want)) do
    if got[k] == nil then S.fail("%s: output %q missing on %s", what, k, DEV) end
    local mode = compare
    if type(compare) == "function" then mode = compare(k) end
    compare_one(got[k], want[k], mode or "bytes", what .. ": " .. k)
  end
end

-- "name [k=v, ...]" with the parameters in sorted order (tables as AxB)
function H.test_name(case)
  local p = case.params
  if not p or next(p) == nil then return case.name end
  local parts = {}
  for _, k in ipairs(sorted_keys(p)) do
    local v = p[k]
    if type(v) == "table" then v = table.concat(v, "x") else v = tostring(v) end
    parts[#parts + 1] = k .. "=" .. v
  end
  return string.format("%s [%s]", case.name, table.concat(parts, ", "))
end

-- one case, both devices, everything compared
function H.run_case(case)
  local p = case.params or {}
  local name = H.test_name(case)
  local in_ref = case.inputs and case.inputs(REF, p) or {}
  local in_dev = case.inputs and case.inputs(DEV, p) or {}
  H.compare(in_dev, in_ref, case.inputs_compare or "bytes", name .. ": input")
  local want = case.run(REF, in_ref, p)
  local got = case.run(DEV, in_dev, p)
  H.compare(got, want, case.compare or "bytes", name)
  if case.check then case.check(got, want, in_dev, in_ref, p) end
end

-- Generates one busted test per case. env: { it = it, pending = pending } of the calling spec
-- (busted's functions are globals of the spec file's environment, not of this module).
function H.run(cases, env)
  for _, case in ipairs(cases) do
    local name = H.test_name(case)
    if case.needs and case.needs ~= DEV then
      env.pending(string.format("%s (skipped: needs %s, the device under test is %s)", name,
                                case.needs, DEV))
    else
      S.test(env.it, name, function() H.run_case(case) end)
    end
  end
end

return H

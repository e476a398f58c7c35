-- Shared by the GPU specs: which device is under test (LUTRA_GPU_SPEC_DEVICE, default cuda;
-- "cpu" dry-runs the suite CPU against CPU), whether it can run, and a test wrapper that fails
-- at once, saying why, when it cannot. Not a spec itself (no _gpu in its name).
local lutra = require("lutra")
local assert = require("luassert")
local HUGE = math.huge

local S = {}
local DEV = os.getenv("LUTRA_GPU_SPEC_DEVICE")
if DEV == nil or DEV == "" then DEV = "cuda" end
S.DEV, S.REF = DEV, "cpu"
-- LUTRA_GPU_SPEC_VERBOSE=1 prints every measured NMSE (or loss) to stderr, to see the margins
local VERBOSE = (os.getenv("LUTRA_GPU_SPEC_VERBOSE") or "") ~= "" and os.getenv("LUTRA_GPU_SPEC_VERBOSE") ~= "0"
function S.note(fmt, ...)
  if VERBOSE then io.stderr:write(string.format(fmt, ...), "\n") end
end

local DEV_OK, DEV_WHY
do
  local ok, avail = pcall(lutra.device_available, DEV)
  if not ok then
    DEV_OK, DEV_WHY = false, tostring(avail)
  elseif avail then
    DEV_OK = true
  else
    local ok2, err = pcall(lutra.tensor, { 1 }, "f32", DEV)
    DEV_OK = false
    DEV_WHY = ok2 and "lutra.device_available returned false" or tostring(err)
  end
end

-- Owners (quantizers, modules, losses) of tensors that are read later are held here until the
-- test ends, so that the GC cannot free an owner (and its outputs) while a result is compared.
local held = {}
function S.hold(obj)
  held[#held + 1] = obj
  return obj
end

-- it() that fails at once, saying why, when the device under test cannot run.
function S.test(it, name, fn)
  it(name, function()
    if not DEV_OK then
      error(string.format("GPU spec device '%s' is not available: %s (set LUTRA_GPU_SPEC_DEVICE=cpu "
                          .. "to dry-run this suite on the CPU)", DEV, DEV_WHY), 0)
    end
    held = {}
    fn()
    held = {}
  end)
end

function S.fail(fmt, ...) error(string.format(fmt, ...), 2) end

function S.isfinite(v) return v == v and v ~= HUGE and v ~= -HUGE end

-- NMSE of got against ref (float* of n values); fails on a non-finite element of either
function S.nmse_buf(got, ref, n, what)
  local num, den, worst, wi = 0, 0, -1, 0
  for i = 0, n - 1 do
    local g, r = got[i], ref[i]
    if not S.isfinite(g) then
      S.fail("%s: element %d is %s on %s (reference %.9g): not written or overflowed", what, i,
             tostring(g), DEV, r)
    end
    if not S.isfinite(r) then S.fail("%s: reference element %d is %s", what, i, tostring(r)) end
    local d = g - r
    num, den = num + d * d, den + r * r
    if math.abs(d) > worst then worst, wi = math.abs(d), i end
  end
  local e = den > 0 and num / den or (num == 0 and 0 or math.huge)
  return e, wi, worst
end

-- NMSE of two tensors (same dims and dtype) <= bound; returns the NMSE
function S.assert_nmse(got, want, bound, what)
  assert.are.same(want:dims(), got:dims(), what .. ": dims")
  assert.are.equal(want:dtype_name(), got:dtype_name(), what .. ": dtype")
  local g, w = got:read(), want:read()
  local e, wi, worst = S.nmse_buf(g, w, want:size(), what)
  S.note("NMSE %.3e (bound %.0e)  %s", e, bound, what)
  if not (e <= bound) then
    S.fail("%s: NMSE %.3e > bound %.1e (largest difference %.3g at element %d: %.9g vs reference %.9g)",
           what, e, bound, worst, wi, g[wi], w[wi])
  end
  return e
end

return S

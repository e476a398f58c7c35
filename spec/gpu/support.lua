-- Shared by the GPU specs: which device is under test, whether it can run, a test wrapper that
-- fails at once, saying why, when it cannot, and the helpers every GPU spec needs (poisoned
-- outputs, the same random inputs on both devices, exact and NMSE comparisons). The table-driven
-- harness over these is spec/support/op_harness.lua. Not a spec itself (no _gpu in its name).
--
-- Device choice: LUTRA_TEST_DEVICE (LUTRA_GPU_SPEC_DEVICE, the older name, is still read),
-- default "cuda".
--   cpu   the "device" side runs on the CPU too: a smoke test of every spec on a machine without
--         a GPU (CPU against CPU, so it checks the Lua, the poisoning and the comparisons).
--   auto  cuda when it is available, else cpu (said on stderr).
--   cuda  (or unset) cuda; when it is not available every test fails, saying why, so that a GPU
--         run can never pass silently on the CPU.
local lutra = require("lutra")
local ffi = require("ffi")
local assert = require("luassert")
local C = lutra.C
local HUGE = math.huge

local S = {}

local function env(name)
  local v = os.getenv(name)
  if v == "" then return nil end
  return v
end

local function probe(dev)
  local ok, avail = pcall(lutra.device_available, dev)
  if not ok then return false, tostring(avail) end
  if avail then return true end
  local ok2, err = pcall(lutra.tensor, { 1 }, "f32", dev)
  return false, ok2 and "lutra.device_available returned false" or tostring(err)
end

local DEV = env("LUTRA_TEST_DEVICE") or env("LUTRA_GPU_SPEC_DEVICE") or "cuda"
local DEV_OK, DEV_WHY
if DEV == "auto" then
  DEV_OK, DEV_WHY = probe("cuda")
  if DEV_OK then
    DEV = "cuda"
  else
    io.stderr:write("LUTRA_TEST_DEVICE=auto: cuda is not available (", DEV_WHY, "): running the ",
                    "GPU specs CPU against CPU\n")
    DEV = "cpu"
  end
end
DEV_OK, DEV_WHY = probe(DEV)
S.DEV, S.REF = DEV, "cpu"

-- LUTRA_GPU_SPEC_VERBOSE=1 prints every measured NMSE (or loss) to stderr, to see the margins
local VERBOSE = (env("LUTRA_GPU_SPEC_VERBOSE") or "0") ~= "0"
function S.note(fmt, ...)
  if VERBOSE then io.stderr:write(string.format(fmt, ...), "\n") end
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
      error(string.format("GPU spec device '%s' is not available: %s (set LUTRA_TEST_DEVICE=cpu "
                          .. "to smoke-test this suite on the CPU)", DEV, DEV_WHY), 0)
    end
    held = {}
    fn()
    held = {}
  end)
end

function S.fail(fmt, ...) error(string.format(fmt, ...), 2) end

function S.isfinite(v) return v == v and v ~= HUGE and v ~= -HUGE end

-- ---- inputs and outputs ----------------------------------------------------------------------

-- a tensor full of NaN: what a kernel does not write stays non-finite
function S.poisoned(shape, dtype, device)
  return lutra.tensor(shape, dtype, device):fill(0 / 0)
end

-- the same random tensor on both devices (generated on the host from the seed)
function S.randn_pair(shape, dtype, seed, std, mean)
  return lutra.tensor(shape, dtype, S.REF):randn(seed, mean or 0, std or 1),
         lutra.tensor(shape, dtype, S.DEV):randn(seed, mean or 0, std or 1)
end

-- num expert row counts summing to total (GroupedLinear), from seed: about a fifth of them 0
-- (empty experts), the others of any size (no multiple of an alignment)
function S.random_splits(num, total, seed, empty)
  math.randomseed(seed)
  local s, left = {}, total
  for e = 1, num - 1 do
    local v = math.random() < (empty or 0.2) and 0 or math.random(0, math.floor(2 * total / num))
    if v > left then v = left end
    s[e], left = v, left - v
  end
  s[num] = left
  return s
end

-- the same host values (a float* of the tensor's size) on both devices
function S.from_buf_pair(buf, shape, dtype)
  return lutra.tensor(shape, dtype, S.REF):set(buf), lutra.tensor(shape, dtype, S.DEV):set(buf)
end

-- a float[] holding a Lua array of numbers
function S.buf_of(values)
  local b = ffi.new("float[?]", #values)
  for i = 1, #values do b[i - 1] = values[i] end
  return b
end

-- a copy of t that the owner's next call does not overwrite
function S.keep(t)
  return lutra.tensor(t:dims(), t:dtype_name(), t:device_name()):copy(t)
end

-- x rounded to f32
S.f32 = require("spec.support.f32")

-- t:amax() cannot be called from Lua: the struct field lutra_tensor.amax (a float*) hides the
-- method of the same name in lua/lutra/tensor.lua, so the C call is used directly.
local amax_box = ffi.new("float[1]")
function S.amax_of(t)
  local st = C.lutra_tensor_amax(t, amax_box)
  if st ~= 0 then error(ffi.string(C.lutra_last_error()), 2) end
  return amax_box[0]
end

-- ---- comparisons -----------------------------------------------------------------------------

function S.same_meta(got, want, what)
  assert.are.same(want:dims(), got:dims(), what .. ": dims")
  assert.are.equal(want:dtype_name(), got:dtype_name(), what .. ": dtype")
end

local function hex_at(s, e, esize)
  return (s:sub(e * esize + 1, e * esize + esize):gsub(".", function(c)
    return string.format("%02x", c:byte()) end))
end

-- the value of element e of a byte string of float dtype code (nil for other dtypes)
local function value_at(s, e, code)
  if code == C.LUTRA_F32 then return ffi.cast("const float*", s)[e] end
  if code == C.LUTRA_BF16 or code == C.LUTRA_F16 then
    return C.lutra_decode(code, ffi.cast("const uint16_t*", s)[e])
  end
  if code == C.LUTRA_E4M3 or code == C.LUTRA_E5M2 then return C.lutra_decode(code, s:byte(e + 1)) end
end

-- byte strings must be identical; esize groups bytes into elements for the message, and a
-- float dtype code (optional) decodes both values there
-- Everything one quantization t shows, as byte strings keyed by what they are: each asked-for
-- copy's codes, its scales (scale_bytes(t, columnwise) -> bytes, under the key "<copy> <label>")
-- and its dequantization into f32 and bf16 (outputs poisoned first).
function S.quantized_outputs(t, rowwise, columnwise, scale_bytes, label)
  local out, d = {}, t:dims()
  for _, cw in ipairs { false, true } do
    if (cw and columnwise) or (not cw and rowwise) then
      local side = cw and "columnwise" or "rowwise"
      out[side .. " codes"] = t:bytes(cw)
      out[side .. " " .. label] = scale_bytes(t, cw)
      local shape = cw and { d[2], d[1] } or d
      for _, od in ipairs { "f32", "bf16" } do
        local y = lutra.dequantize(t, S.poisoned(shape, od, t:device_name()), cw)
        out[side .. " dequantized " .. od] = y:bytes(false)
      end
    end
  end
  return out
end

-- outputs(t, rowwise, columnwise) for the tensors of one scaling (scaling_name; t is checked to
-- be of it): S.quantized_outputs with the scale arrays of spec/support/fp8_bytes.lua, under label
function S.outputs_of(scaling, label)
  local scale_bytes = require("spec.support.fp8_bytes").scale_bytes
  return function(t, rowwise, columnwise)
    assert.are.equal(scaling, t:scaling_name())
    return S.quantized_outputs(t, rowwise, columnwise, scale_bytes, label)
  end
end

function S.assert_same_bytes(got, want, what, esize, code)
  if got == want then return end
  esize = esize or 1
  if #got ~= #want then S.fail("%s: %d bytes, reference %d", what, #got, #want) end
  local first, count = nil, 0
  for i = 1, #want do
    if got:byte(i) ~= want:byte(i) then
      count = count + 1
      first = first or i
    end
  end
  local e = math.floor((first - 1) / esize)
  local values = ""
  if code and value_at(want, e, code) then
    values = string.format(" (%.9g vs %.9g)", value_at(got, e, code), value_at(want, e, code))
  end
  S.fail("%s: %d of %d bytes differ; first at element %d: 0x%s vs reference 0x%s%s", what, count,
         #want, e, hex_at(got, e, esize), hex_at(want, e, esize), values)
end

-- two tensors hold the same bits (rowwise data, or the columnwise copy)
function S.assert_same_tensor(got, want, what, columnwise)
  S.same_meta(got, want, what)
  S.assert_same_bytes(got:bytes(columnwise), want:bytes(columnwise), what,
                      tonumber(C.lutra_dtype_size(want.dtype)), want.dtype)
end

-- Elements of a float dtype (code: LUTRA_F32, LUTRA_BF16 or LUTRA_F16) as bytes: identical
-- bits, except that NaN only has to stay NaN (the payload of a NaN is not specified across
-- backends).
local BITS = { [4] = "const uint32_t*", [2] = "const uint16_t*" }
function S.assert_same_bits_nan(got, want, code, what)
  if got == want then return end
  assert.are.equal(#want, #got, what .. ": byte count")
  local esize = tonumber(C.lutra_dtype_size(code))
  local g, w = ffi.cast(BITS[esize], got), ffi.cast(BITS[esize], want)
  local gf, wf = ffi.cast("const float*", got), ffi.cast("const float*", want)
  for i = 0, #want / esize - 1 do
    if g[i] ~= w[i] then
      local gv, wv
      if esize == 4 then gv, wv = gf[i], wf[i]
      else gv, wv = C.lutra_decode(code, g[i]), C.lutra_decode(code, w[i]) end
      if not (gv ~= gv and wv ~= wv) then
        S.fail("%s: element %d is 0x%s (%.9g), reference 0x%s (%.9g)", what, i,
               hex_at(got, i, esize), gv, hex_at(want, i, esize), wv)
      end
    end
  end
end
-- the older name, for 16-bit floats
S.assert_same_half_bits = S.assert_same_bits_nan

-- NMSE of got against ref (float* of n values) and the largest difference and its index; fails
-- on a non-finite element of either
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

-- NMSE of got against want (same dims; dtypes may differ: a device result against an f32
-- reference) <= bound, the failure naming the inputs' seed; the NMSE noted (LUTRA_GPU_SPEC_VERBOSE)
function S.check_nmse(got, want, bound, what, seed)
  assert.are.same(want:dims(), got:dims(), what .. ": dims")
  local e, wi, worst = S.nmse_buf(got:read(), want:read(), want:size(), what)
  S.note("NMSE %.3e (bound %.0e), max |diff| %.3g  %s", e, bound, worst, what)
  if not (e <= bound) then
    S.fail("%s: NMSE %.3e > %.0e (largest difference %.3g at element %d; seed %d)", what, e, bound,
           worst, wi, seed)
  end
  return e
end

-- A replayed graph's results got[i] (named names[i]) against an eager run's want[i]: bit for bit
-- where exact(i), else within NMSE bound (a nondeterministic kernel's other summation order)
function S.assert_replay(got, want, names, exact, bound, label, seed)
  for i, name in ipairs(names) do
    local what = label .. ": " .. name
    if exact(i) then
      assert.are.equal(want[i]:bytes(), got[i]:bytes(), what .. " differs from eager")
    else
      S.check_nmse(got[i], want[i], bound, what, seed)
    end
  end
end

-- NMSE of two tensors (same dims and dtype) <= bound (and, when given, every |difference| <=
-- max_abs); returns the NMSE
function S.assert_nmse(got, want, bound, what, max_abs)
  S.same_meta(got, want, what)
  local g, w = got:read(), want:read()
  local e, wi, worst = S.nmse_buf(g, w, want:size(), what)
  S.note("NMSE %.3e (bound %.0e), max |diff| %.3g  %s", e, bound or -1, worst, what)
  if bound and not (e <= bound) then
    S.fail("%s: NMSE %.3e > bound %.1e (largest difference %.3g at element %d: %.9g vs reference %.9g)",
           what, e, bound, worst, wi, g[wi], w[wi])
  end
  if max_abs and not (worst <= max_abs) then
    S.fail("%s: |difference| %.3g > max_abs %.3g at element %d: %.9g vs reference %.9g (NMSE %.3e)",
           what, worst, max_abs, wi, g[wi], w[wi], e)
  end
  return e
end


-- a spec's seeds: the first drawn from the clock (failures name it), and a function giving the
-- next one at each call
function S.clock_seeds()
  local first = os.time() % 100000
  local next_seed = first
  return first, function()
    next_seed = next_seed + 1
    return next_seed
  end
end

-- a bf16 input on DEV drawn from seed, and its exact f32 copy on the CPU (returned first)
function S.bf16_pair(shape, seed)
  local d = lutra.tensor(shape, "bf16", DEV):randn(seed)
  return lutra.tensor(shape, "f32", S.REF):set(d:read()), d
end

-- every parameter's gradient (grad: "grad" or "main_grad") of module dev against ref's:
-- NMSE <= bound, each named "WHAT: GRAD of parameter I"
function S.assert_grads_nmse(ref, dev, bound, what, grad)
  local pr, pd = ref:parameters(), dev:parameters()
  for i = 1, #pr do
    S.assert_nmse(pd[i][grad], pr[i][grad], bound, string.format("%s: %s of parameter %d", what,
                                                                     grad, i))
  end
end

-- ---- recipes on both sides -------------------------------------------------------------------

-- an autocast scope per side, each of its own recipe from make() (held until the test ends);
-- nil, nil without make
function S.autocast_pair(make)
  if not make then return nil, nil end
  return S.hold(lutra.autocast { recipe = make() }), S.hold(lutra.autocast { recipe = make() })
end

-- fn() inside scope, or plainly without one; fn's results
function S.under(scope, fn)
  if scope then return scope:run(fn) end
  return fn()
end

-- ---- CUDA graphs of training steps -----------------------------------------------------------
-- The two sides of a graph check over the same n batches. t is a trainer (a table whose step
-- runs one training step on its own inputs); feed(t, i) loads batch i into those inputs.

-- a trainer's step: forward() (t.net's forward of t.x unless given) inside t.scope when it has
-- one (entered and exited by hand, as a training loop does), the loss against t.target, the
-- backward through t.net and t.opt's step
function S.training_step(t, forward)
  forward = forward or function() return t.net:forward(t.x) end
  return function()
    if t.scope then t.scope:enter() end
    local y = forward()
    if t.scope then t.scope:exit() end
    t.loss:forward(y, t.target)
    t.net:backward(t.loss:backward())
    t.opt:step()
  end
end

-- n random batches (x of x_shape seeded x_seed + i, target of t_shape seeded t_seed + i, dtype
-- f32 unless given) on the device, and feed(t, i) copying batch i into t.x and t.target
function S.batch_feed(n, x_shape, t_shape, x_seed, t_seed, dtype)
  local xs, ts = {}, {}
  for i = 1, n do
    xs[i] = lutra.tensor(x_shape, dtype or "f32", S.DEV):randn(x_seed + i)
    ts[i] = lutra.tensor(t_shape, dtype or "f32", S.DEV):randn(t_seed + i)
  end
  return function(t, i)
    t.x:copy(xs[i])
    t.target:copy(ts[i])
  end
end

-- every parameter of trainers a and b (their .net) the same bytes
function S.assert_same_params(a, b, what)
  local pa, pb = a.net:parameters(), b.net:parameters()
  assert.are.equal(#pa, #pb, what .. ": parameter count")
  for i = 1, #pa do
    assert.are.equal(pa[i].value:bytes(), pb[i].value:bytes(), what .. ": parameter " .. i)
  end
end

-- the eager side: batch i fed, then t.step(), for i = 1..n
function S.eager_steps(t, n, feed)
  for i = 1, n do
    feed(t, i)
    t.step()
  end
end

-- the graphed side: batch 1 fed and t.step captured with one warm-up (the warm-up is step 1,
-- run eagerly; the capture records step 2 without running it); after_capture(graph), when
-- given, runs next; then batch i fed and the graph replayed for i = 2..n, and the device
-- synchronized. Returns the graph (the caller frees it).
function S.replayed_steps(t, n, feed, after_capture)
  feed(t, 1)
  local graph = lutra.graph.capture(t.step, { warmup = 1 })
  if after_capture then after_capture(graph) end
  for i = 2, n do
    feed(t, i)
    graph:replay()
  end
  lutra.synchronize(S.DEV)
  return graph
end

-- ---- the quantization formats' device checks (nvfp4_gpu, rowwise_gpu) -------------------------

-- a 32x64 f32 input with the special cases on both sides: 16 zeros in each row of 64, a
-- subnormal, a NaN, both infinities and, at the indices extra gives (when given), its values
function S.special_values_pair(extra)
  local v = {}
  for i = 1, 32 * 64 do
    local k = i % 64
    v[i] = (k < 16) and 0 or (k == 17) and 1e-40 or (i == 300) and 0 / 0 or
           (i == 700) and HUGE or (i == 701) and -HUGE or (extra and extra[i]) or
           (i % 7 - 3) * 0.37
  end
  return S.from_buf_pair(S.buf_of(v), { 32, 64 }, "f32")
end

-- the GEMM of a weight [128, 256] and an input [64, 256] (standard deviation b_std, 1 unless
-- given), each quantized on each side by a quantizer of recipe() for its role: the device's
-- product within NMSE bound of the CPU's
function S.assert_quantized_gemm(recipe, bound, what, b_std)
  local out = {}
  for i, dev in ipairs { S.REF, S.DEV } do
    local r = recipe()
    local a = S.hold(lutra.quantizer(r, "weight", { device = dev })):quantize(
      lutra.tensor({ 128, 256 }, "f32", dev):randn(5))
    local b = S.hold(lutra.quantizer(r, "input", { device = dev })):quantize(
      lutra.tensor({ 64, 256 }, "f32", dev):randn(6, 0, b_std or 1))
    out[i] = lutra.gemm(a, true, b, false, S.poisoned({ 64, 128 }, "f32", dev))
  end
  S.assert_nmse(out[2], out[1], bound, what)
end

-- a Linear(128, 64)'s forward under recipe() and backward on each side, from the same weights,
-- x [rows, 128] and dy (dtype f32 unless given): the CPU's and the device's y, dx, dw and, with
-- a bias, db
function S.linear_step_pair(recipe, rows, dtype)
  local res = {}
  for i, dev in ipairs { S.REF, S.DEV } do
    local lin = S.hold(lutra.nn.Linear(128, 64, { seed = 7, device = dev, dtype = dtype }))
    local x = lutra.tensor({ rows, 128 }, dtype or "f32", dev):randn(8)
    local dy = lutra.tensor({ rows, 64 }, dtype or "f32", dev):randn(9, 0, 0.1)
    local y = lutra.autocast { recipe = recipe() }:run(function() return lin:forward(x) end)
    local params = lin:parameters()
    res[i] = { y = S.keep(y), dx = S.keep(lin:backward(dy)), dw = S.keep(params[1].grad) }
    if params[2] then res[i].db = S.keep(params[2].grad) end
  end
  return res[1], res[2]
end

-- ---- GroupedLinear pairs ---------------------------------------------------------------------

-- o.steps forwards and backwards of the GroupedLinear pair ref (the CPU's) and dev, each on
-- fresh inputs of o.dtype: step i's o.rows rows split by o.splits(i) (dev gets them in a device
-- tensor, or with o.host_splits in a CPU one), x and dy seeded by o.seeds(i), each side under an
-- autocast scope of its own o.recipe() (none without o.recipe), the device's splits checked after
-- each backward when o.check; y, dx and every expert's grad (main_grad with o.amg) within NMSE
-- o.bound
function S.assert_grouped_steps(ref, dev, o)
  local scope_r, scope_d = S.autocast_pair(o.recipe)
  local dsplits
  for step = 1, o.steps do
    local splits = o.splits(step)
    if o.host_splits then
      dsplits = lutra.from_table(splits, { #splits }, "i32", "cpu")
    else
      dsplits = dsplits or lutra.tensor({ #splits }, "i32", S.DEV)
      dsplits:set(splits)
    end
    local x_seed, dy_seed = o.seeds(step)
    local xr, xd = S.randn_pair({ o.rows, o.in_ }, o.dtype, x_seed)
    local dyr, dyd = S.randn_pair({ o.rows, o.out }, o.dtype, dy_seed)
    local what = o.what .. ", step " .. step
    local yr = S.under(scope_r, function() return ref:forward(xr, splits) end)
    local yd = S.under(scope_d, function() return dev:forward(xd, dsplits) end)
    S.assert_nmse(yd, yr, o.bound, what .. ": y")
    local dxr, dxd = ref:backward(dyr), dev:backward(dyd)
    if o.check then dev:check_splits() end
    S.assert_nmse(dxd, dxr, o.bound, what .. ": dx")
    S.assert_grads_nmse(ref, dev, o.bound, what, o.amg and "main_grad" or "grad")
  end
end

-- equal values (NaN equal to NaN) of two tables, element by element
function S.same_values(got, want, what)
  assert.are.equal(#want, #got, what)
  for i = 1, #want do
    if not (got[i] == want[i] or (got[i] ~= got[i] and want[i] ~= want[i])) then
      S.fail("%s: element %d differs: %.9g vs %.9g", what, i, got[i], want[i])
    end
  end
end

-- the CUDA runtime liblutra links (already loaded: its soname), for a stream capture of a
-- spec's own (not lutra.graph's)
function S.cudart()
  local ffi = require("ffi")
  pcall(ffi.cdef, [[
    int cudaStreamCreateWithFlags(void **stream, unsigned int flags);
    int cudaStreamDestroy(void *stream);
    int cudaStreamSynchronize(void *stream);
    int cudaStreamBeginCapture(void *stream, int mode);
    int cudaStreamEndCapture(void *stream, void **graph);
    int cudaGraphInstantiate(void **exec, void *graph, unsigned long long flags);
    int cudaGraphLaunch(void *exec, void *stream);
    int cudaGraphExecDestroy(void *exec);
    int cudaGraphDestroy(void *graph);
  ]])
  for _, name in ipairs { "libcudart.so.13", "libcudart.so.12", "libcudart.so", "cudart" } do
    local ok, lib = pcall(ffi.load, name)
    if ok then return lib end
  end
  error("the CUDA runtime library could not be loaded")
end

-- fn(rt, stream) with lutra on a new non-blocking stream of the spec's own (rt: S.cudart()),
-- and lutra back on its own stream afterwards, whatever fn did
function S.with_caller_stream(fn)
  local rt = S.cudart()
  local box = require("ffi").new("void *[1]")
  assert.are.equal(0, rt.cudaStreamCreateWithFlags(box, 1))
  local stream = box[0]
  lutra.cuda_set_stream(stream)
  local ok, err = pcall(fn, rt, stream)
  lutra.synchronize(S.DEV)
  lutra.cuda_set_stream(nil)
  rt.cudaStreamDestroy(stream)
  assert(ok, err)
end

return S

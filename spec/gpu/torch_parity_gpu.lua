-- DotProductAttention and TransformerLayer on the device (bf16) against PyTorch: the inputs,
-- weights and lutra's outputs written into a folder, spec/gpu/torch_reference.py computing the
-- same in float64 with F.scaled_dot_product_attention and a layer composed by hand from
-- torch.nn.functional with lutra's weights, and the NMSE of each output and gradient held to a
-- bound here. Bounds: attention output 1e-4 and gradients 1e-3 (bf16 inputs are exact in f64;
-- lutra rounds each output once to bf16, 2^-9 relative, NMSE ~1e-6, and cuDNN's bf16 P @ V and
-- its backward's bf16 dS add what the f32 CPU comparison in attention_gpu.lua measures, ~1e-5
-- fwd / ~1e-4 bwd); the layer as transformer_gpu.lua's against the CPU, 1e-3 for y and dx and
-- 1e-2 for the weight gradients (sums of B T bf16 products). Needs python3 with torch on the
-- machine (pending otherwise).
local lutra = require("lutra")
local nn = lutra.nn
local ffi = require("ffi")
local shell = require("spec.support.shell")
local S = require("spec.gpu.support")
local DEV = S.DEV
local function test(name, fn) S.test(it, name, fn) end

local SEED = os.time() % 100000
local HAVE_TORCH = shell.sh("python3 -c 'import torch; assert torch.cuda.is_available()'")

-- a folder of raw f32 tensors and their manifest
local function folder()
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p '" .. dir .. "'"))
  local manifest = assert(io.open(dir .. "/manifest.txt", "w"))
  local out = { dir = dir }
  function out.put(name, t)
    local n = t:size()
    local f = assert(io.open(dir .. "/" .. name .. ".f32", "wb"))
    f:write(ffi.string(t:read(), n * 4))
    f:close()
    manifest:write(name, " ", table.concat(t:dims(), " "), "\n")
  end
  function out.close() manifest:close() end
  return out
end

-- the reference's NMSE per name, each within its bound (bound(name))
local function compare(dir, args, bound, expected)
  local ok, out = shell.sh("python3 spec/gpu/torch_reference.py '" .. dir .. "' " .. args)
  assert.is_true(ok, out)
  local seen = 0
  for name, value in out:gmatch("nmse (%S+) (%S+)") do
    local e, b = tonumber(value), bound(name)
    S.note("NMSE %.3e (bound %.0e)  %s", e, b, name)
    if not (e <= b) then
      S.fail("%s: NMSE %.3e > %.0e against PyTorch (seed %d)", name, e, b, SEED)
    end
    seen = seen + 1
  end
  assert.are.equal(expected, seen, out)
  os.execute("rm -rf '" .. dir .. "'")
end

describe("lutra on " .. DEV .. " against PyTorch in float64", function()
  if not HAVE_TORCH then
    pending("skipped: python3 with torch and a GPU is not available here")
    return
  end

  test("DotProductAttention (GQA, causal, T 77): output and dq, dk, dv", function()
    local B, T, H, Hkv, D = 2, 77, 8, 2, 64
    local m = S.hold(nn.DotProductAttention(H, D, { num_gqa_groups = Hkv, dtype = "bf16",
                                                    device = DEV }))
    local q = lutra.tensor({ B, T, H, D }, "bf16", DEV):randn(SEED)
    local k = lutra.tensor({ B, T, Hkv, D }, "bf16", DEV):randn(SEED + 1)
    local v = lutra.tensor({ B, T, Hkv, D }, "bf16", DEV):randn(SEED + 2)
    local dout = lutra.tensor({ B, T, H, D }, "bf16", DEV):randn(SEED + 3)
    local f = folder()
    for name, t in pairs({ q = q, k = k, v = v, dout = dout }) do f.put(name, t) end
    f.put("out", m:forward(q, k, v))
    local dq, dk, dv = m:backward(dout)
    f.put("dq", dq)
    f.put("dk", dk)
    f.put("dv", dv)
    f.close()
    compare(f.dir, "attention causal", function(name) return name == "out" and 1e-4 or 1e-3 end, 4)
  end)

  test("TransformerLayer: y, dx and every parameter's gradient", function()
    local B, T, hidden, ffn, H = 2, 64, 256, 1024, 4
    local layer = S.hold(nn.TransformerLayer(hidden, ffn, H, { dtype = "bf16", device = DEV,
                                                               seed = SEED }))
    local x = lutra.tensor({ B, T, hidden }, "bf16", DEV):randn(SEED + 4)
    local dy = lutra.tensor({ B, T, hidden }, "bf16", DEV):randn(SEED + 5)
    local f = folder()
    f.put("x", x)
    f.put("dy", dy)
    f.put("y", layer:forward(x))
    f.put("dx", layer:backward(dy))
    lutra.save(f.dir .. "/layer.safetensors", { model = layer, fp8 = false })
    -- the gradients under the weights' names: copied into a second layer's parameters, saved
    local params = layer:parameters()
    local twin = nn.TransformerLayer(hidden, ffn, H, { dtype = "bf16", device = DEV })
    for i, prm in ipairs(twin:parameters()) do prm.value:copy(params[i].grad) end
    lutra.save(f.dir .. "/grads.safetensors", { model = twin, fp8 = false })
    f.close()
    compare(f.dir, "layer " .. H, function(name) return name:match("^grad:") and 1e-2 or 1e-3 end,
            2 + #params)
  end)
end)

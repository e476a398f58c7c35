-- Weight tying on the device (spec/tie_spec.lua is the CPU's): the embedding's backward adds its
-- rows into the shared gradient in the weight's dtype (the kernel's LUTRA_EMBEDDING_ADD mode)
-- when the tied head wrote it first, and the head's wgrad GEMM accumulates (beta = 1) when the
-- embedding wrote first. Checked on the device against the untied modules' parts summed there:
--   f32, head first: bit for bit (the GEMM's bits, plus one f32 rounding of the row sums);
--   otherwise within rel * (|a| + |b|): f32 2^-20 (cuBLAS's beta = 1 may round the sum inside its
--   epilogue in another order), bf16 2^-7 (one more bf16 rounding than each part alone).
-- A captured training step (Sequential(emb, Linear, tied head), AdamW) replayed equals the same
-- steps run eagerly, bit for bit: the overwrite/add decisions were made at capture and repeat.
local lutra = require("lutra")
local ffi = require("ffi")
local nn = lutra.nn
local S = require("spec.gpu.support")
local DEV = S.DEV
local function test(name, fn) S.test(it, name, fn) end

local V, D, N = 64, 32, 48

local function id_list(seed)
  local state, ids = seed, {}
  for i = 1, N do
    state = (state * 1103515245 + 12345) % 2147483648
    ids[i] = state % V
  end
  return ids
end
local function ids_of(seed) return lutra.from_table(id_list(seed), { N }, "i32", DEV) end

describe("weight tying on " .. DEV, function()
  for _, case in ipairs { { "f32", 2 ^ -20 }, { "bf16", 2 ^ -7 } } do
    local dt, rel = case[1], case[2]
    test(dt .. ": the shared gradient is the sum of both parts, either order", function()
      local o = { dtype = dt, device = DEV }
      local emb = nn.Embedding(V, D, { dtype = dt, device = DEV, seed = 5 })
      local head = nn.Linear(D, V, { bias = false, weight = emb, dtype = dt, device = DEV })
      local emb2, head2 = nn.Embedding(V, D, o), nn.Linear(D, V, { bias = false, dtype = dt,
                                                                  device = DEV })
      emb2:parameters()[1].value:copy(emb:parameters()[1].value)
      head2:parameters()[1].value:copy(emb:parameters()[1].value)
      for k, emb_first in ipairs { false, true, false } do
        local ids = ids_of(100 + k)
        local x = lutra.tensor({ N, D }, dt, DEV):randn(200 + k)
        local dy_e = lutra.tensor({ N, D }, dt, DEV):randn(300 + k)
        local dy_h = lutra.tensor({ N, V }, dt, DEV):randn(400 + k)
        emb:forward(ids)
        head:forward(x)
        if emb_first then
          emb:backward(dy_e)
          head:backward(dy_h)
        else
          head:backward(dy_h)
          emb:backward(dy_e)
        end
        emb2:forward(ids)
        emb2:backward(dy_e)
        head2:forward(x)
        head2:backward(dy_h)
        local a, b = emb2:parameters()[1].grad:to_table(), head2:parameters()[1].grad:to_table()
        local got = emb:parameters()[1].grad:to_table()
        local exact = dt == "f32" and not emb_first
        for i = 1, #a do
          local want = exact and tonumber(ffi.new("float", a[i] + b[i])) or a[i] + b[i]
          local tol = exact and 0 or rel * (math.abs(a[i]) + math.abs(b[i])) + 1e-30
          if math.abs(got[i] - want) > tol then
            S.fail("%s, emb_first=%s, round %d: dW[%d] = %.9g, parts sum to %.9g", dt,
                   tostring(emb_first), k, i, got[i], want)
          end
        end
      end
    end)
  end

  test("a captured step replays the eager steps bit for bit", function()
    if DEV == "cpu" then return end -- graphs are CUDA's (spec/gpu/graph_gpu.lua checks the refusal)
    local function trainer()
      lutra.manual_seed(9)
      local emb = nn.Embedding(V, D, { device = DEV })
      local t = {
        net = nn.Sequential(emb, nn.Linear(D, D, { device = DEV }),
                            nn.Linear(D, V, { bias = false, weight = emb, device = DEV })),
        x = lutra.tensor({ N }, "i32", DEV),
        target = lutra.tensor({ N, V }, "f32", DEV),
        loss = nn.MSELoss(),
      }
      t.opt = lutra.optim.AdamW(t.net, { lr = 1e-2 })
      t.step = S.training_step(t)
      return t
    end
    local targets = {}
    for i = 1, 5 do targets[i] = lutra.tensor({ N, V }, "f32", DEV):randn(500 + i) end
    local function feed(t, i)
      t.x:set(id_list(600 + i)) -- i32: set from the host (copy takes floats)
      t.target:copy(targets[i])
    end
    local eager, graphed = trainer(), trainer()
    S.eager_steps(eager, 5, feed)
    local g = S.replayed_steps(graphed, 5, feed)
    S.assert_same_params(eager, graphed, "tied model after 5 steps")
    g:destroy()
  end)
end)

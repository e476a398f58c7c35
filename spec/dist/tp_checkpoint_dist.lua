-- Tensor-parallel Linear checkpoints under mpirun: a TP checkpoint holds this rank's shard (each
-- rank saves and loads its own file): "weight" [out/P, in] (column) or [out, in/P] (row),
-- "bias" as the rank keeps it, and the core's quantizers "fp8.input", ... . After a delayed FP8
-- step, a freshly built sharded Linear (other seed) loads the rank's file and then saves the
-- same bytes.
local lutra = require("lutra")
local D = require("spec.dist.support")

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local function names(path)
  local bytes = read(path)
  local n = 0
  for i = 8, 1, -1 do n = n * 256 + bytes:byte(i) end
  local t = {}
  for name, shape in bytes:sub(9, 8 + n):gmatch('"([^"]+)":{"dtype":"[%w_]+","shape":%[([%d,]*)%]') do
    t[name] = shape
  end
  return t
end

describe("dist tensor-parallel Linear checkpoints", function()
  local w = D.world()
  local n = w:size()
  local IN, OUT, R = 16 * n, 16 * n, 16
  local recipe = lutra.recipe.delayed { amax_history_len = 4 }

  for _, mode in ipairs({ "column", "row" }) do
    it(mode .. "-parallel: the file holds this rank's shard, which a fresh shard loads", function()
      local function make(seed)
        return lutra.nn.Linear(IN, OUT, { parallel_mode = mode, tp_group = w, seed = seed })
      end
      local par = make(5)
      local cols = mode == "column" and IN or IN / n
      local x = lutra.tensor({ R, cols })
      x:uniform(17, -1, 1)
      local scope = lutra.autocast { recipe = recipe }
      scope:enter()
      local y = par:forward(x)
      par:backward(y, false)
      scope:exit()
      local path = os.tmpname()
      lutra.save(path, { model = par })
      local want = mode == "column"
        and { weight = (OUT / n) .. "," .. IN, bias = tostring(OUT / n) }
        or { weight = OUT .. "," .. (IN / n), bias = tostring(OUT) }
      for _, q in ipairs({ "input", "weight", "grad_output" }) do
        want["fp8." .. q .. ".scale"], want["fp8." .. q .. ".scale_inv"] = "1", "1"
        want["fp8." .. q .. ".amax_history"] = "4"
      end
      assert.are.same(want, names(path))
      local fresh = make(6)
      assert.is_false(fresh:parameters()[1].value:bytes() == par:parameters()[1].value:bytes())
      lutra.load(path, { model = fresh, recipe = recipe })
      local again = os.tmpname()
      lutra.save(again, { model = fresh })
      local same = read(path) == read(again)
      os.remove(path)
      os.remove(again)
      assert.is_true(same, "the loaded shard saved other bytes")
    end)
  end
end)

-- examples/train_gpt.lua stopped and resumed from its checkpoint computes what an unbroken run
-- computes, bit for bit: the two runs' final checkpoints (model, FP8 state, optimizer,
-- generator) are the same file. On a corpus of fresh random text in a cache made here.
local shell = require("spec.support.shell")

local function random_corpus()
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p '" .. dir .. "'"))
  local t = {}
  for i = 1, 20000 do t[i] = string.char(math.random(32, 126)) end
  local f = assert(io.open(dir .. "/shakespeare.txt", "wb"))
  f:write(table.concat(t))
  f:close()
  return dir
end

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

describe("examples/train_gpt.lua --checkpoint / --resume", function()
  if not pcall(require, "argparse") then
    pending("skipped: lua-argparse is not installed")
    return
  end
  -- the LM head in FP8 too (--fp8-head): its delayed scaling state is checkpointed with the layers'
  for _, case in ipairs({ { "none", 1 }, { "delayed", 1 }, { "none", 2 },
                          { "delayed", 1, "--fp8-head" } }) do
    local recipe, accum, extra = case[1], case[2], case[3] or ""
    it(string.format("a run stopped after step 4 and resumed equals an unbroken one (recipe %s%s, "
                     .. "%d micro-batches a step)", recipe, extra ~= "" and " " .. extra or "",
                     accum), function()
      local dir = random_corpus()
      local run = "LUA_PATH='lua/?.lua;lua/?/init.lua;;' OPENBLAS_NUM_THREADS=1 LUTRA_DATA='" .. dir
                  .. "' luajit examples/train_gpt.lua --steps 6 --every 3 --layers 3 --dim 32 "
                  .. "--heads 2 --batch 2 --seq 16 --sample 0 --warmup 2 --device cpu --recipe "
                  .. recipe .. " " .. extra .. " --accum " .. accum .. " --checkpoint " .. dir
      local ok, out = shell.sh(run .. "/straight.st")
      assert.is_true(ok, out)
      ok, out = shell.sh(run .. "/broken.st --stop-after 4")
      assert.is_true(ok, out)
      assert.matches("stopped after step 4", out, 1, true)
      local interrupted = read(dir .. "/broken.st")
      ok, out = shell.sh(run .. "/broken.st --resume")
      assert.is_true(ok, out)
      assert.matches("resumed from .* after step 4", out)
      local straight, resumed = read(dir .. "/straight.st"), read(dir .. "/broken.st")
      assert.are_not.equal(interrupted, resumed) -- two more steps were taken
      assert.is_true(straight == resumed,
                     "the resumed run's checkpoint differs from the unbroken run's")
      os.execute("rm -rf '" .. dir .. "'")
    end)
  end
end)

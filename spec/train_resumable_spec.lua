-- examples/train_resumable.lua, short: a straight run, a run stopped abruptly after a step
-- between checkpoints (--stop-after) then resumed with --resume, and a run killed with SIGKILL
-- at an arbitrary moment (during a step or a save) then resumed. Each resumed run must end
-- with the straight run's checkpoint, byte for byte, and print the same evaluation losses.
local LUAJIT = os.getenv("LUAJIT") or "luajit"
local EXAMPLE = "examples/train_resumable.lua"

local function sh(cmd)
  local p = assert(io.popen("{ " .. cmd .. "; } 2>&1; echo \"exit=$?\""))
  local out = p:read("*a")
  p:close()
  return tonumber(out:match("exit=(%d+)%s*$")), out
end

local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

local function evals(out)
  local t = {}
  for step, v in out:gmatch("eval (%d+)%s+loss %S+ %((%S+)%)") do t[#t + 1] = step .. " " .. v end
  return t
end

describe("examples/train_resumable.lua", function()
  local dir = os.tmpname()
  os.remove(dir)
  os.execute("mkdir -p " .. dir)
  teardown(function() os.execute("rm -rf " .. dir) end)
  local common = string.format("%s %s --data %s/data.bin --samples 1024 --batch 32 --hidden 64 "
                               .. "--steps 60 --checkpoint-every 20 --eval-every 10 "
                               .. "--progress 25 --recipe delayed", LUAJIT, EXAMPLE, dir)
  local straight_ckpt, straight_evals

  it("trains straight, evaluating and checkpointing, with a progress line", function()
    local code, out = sh(common .. " --checkpoint " .. dir .. "/straight.st")
    assert.are.equal(0, code, out)
    assert.matches("step 25/60  loss [%d.]+ %(%S+%)  [%d.]+ steps/s  ETA [%d.]+s", out)
    straight_evals = evals(out)
    assert.are.equal(6, #straight_evals)
    straight_ckpt = read(dir .. "/straight.st")
    assert.truthy(straight_ckpt)
    -- the loss goes down
    local first = tonumber(straight_evals[1]:match(" (%S+)$"))
    local last = tonumber(straight_evals[6]:match(" (%S+)$"))
    assert.is_true(last < first, out)
  end)

  it("resumes a run stopped between checkpoints to the same end", function()
    local ckpt = dir .. "/stopped.st"
    local code, out = sh(common .. " --checkpoint " .. ckpt .. " --stop-after 50")
    assert.are.equal(3, code, out)
    assert.is_false(read(ckpt) == straight_ckpt) -- it holds step 40
    local code2, out2 = sh(common .. " --checkpoint " .. ckpt .. " --resume")
    assert.are.equal(0, code2, out2)
    assert.matches("resumed from " .. ckpt .. " at step 40", out2, 1, true)
    assert.is_true(read(ckpt) == straight_ckpt, "the resumed run ended elsewhere")
    -- the evaluations of steps 50 and 60, run again after the resume, match the straight run's
    local e = evals(out2)
    assert.are.same({ straight_evals[5], straight_evals[6] }, e)
  end)

  it("resumes a run killed with SIGKILL at an arbitrary moment to the same end", function()
    -- kill at random moments inside a run (its length measured first: it depends on the
    -- machine and its load), until two kills landed (timeout exits 137), resuming after each
    local function now_s()
      local p = io.popen("date +%s.%N")
      local t = tonumber(p:read("*l"))
      p:close()
      return t
    end
    local t0 = now_s()
    sh(common .. " --checkpoint " .. dir .. "/timed.st")
    local length = math.max(now_s() - t0, 0.02)
    local killed = 0
    for attempt = 1, 10 do
      local ckpt = string.format("%s/killed%d.st", dir, attempt)
      local delay = length * (0.1 + 0.7 * math.random())
      local code = sh(string.format("timeout -s KILL %.3f %s --checkpoint %s", delay, common, ckpt))
      local code2, out = sh(common .. " --checkpoint " .. ckpt .. " --resume")
      assert.are.equal(0, code2, out)
      assert.is_true(read(ckpt) == straight_ckpt, "the resumed run ended elsewhere: " .. out)
      if code == 137 then killed = killed + 1 end
      if killed >= 2 then break end
    end
    assert.is_true(killed >= 1, "no kill landed inside a run")
  end)

  it("parses its command line with argparse", function()
    local code, out = sh(LUAJIT .. " " .. EXAMPLE .. " --help")
    assert.are.equal(0, code, out)
    assert.matches("Usage: train_resumable.lua", out, 1, true)
    local bad, out2 = sh(LUAJIT .. " " .. EXAMPLE .. " --no-such-option")
    assert.are_not.equal(0, bad)
    assert.matches("unknown option '--no-such-option'", out2, 1, true)
  end)
end)

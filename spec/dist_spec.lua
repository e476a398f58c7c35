-- The distributed specs (spec/dist/*_dist.lua) under `mpirun -np 2` and `-np 4` on the CPU
-- backend, each test of theirs one spec here (it passes when it passed on every rank), and the
-- failure spec: one rank killed mid-step, the others report an error within the timeout and the
-- job ends. Skipped, saying why, without MPI.
local L = require("spec.support.dist_launch")

describe("distributed (mpirun, cpu)", function()
  local ok, why = L.available()
  if not ok then
    pending("skipped: " .. why)
    return
  end
  for _, np in ipairs({ 2, 4 }) do
    local run = L.run_busted(np)
    local names = run.ranks[0].names
    it(string.format("np=%d: every rank ran every spec and mpirun exited 0", np), function()
      assert.is_true(#names > 0, "rank 0 ran no spec:\n" .. run.ranks[0].text .. run.out)
      for r = 0, np - 1 do
        assert.are.equal(#names, #run.ranks[r].names,
                         "rank " .. r .. " ran another number of specs:\n" .. run.ranks[r].text)
      end
      assert.is_true(run.ok, "mpirun failed:\n" .. run.out)
    end)
    for _, name in ipairs(names) do
      it(string.format("np=%d: %s", np, name), function()
        for r = 0, np - 1 do
          local res = run.ranks[r].results[name]
          assert.is_truthy(res, "rank " .. r .. " did not run it")
          assert.is_true(res.ok, "rank " .. r .. ":\n" .. res.detail)
        end
      end)
    end
  end

  it("a rank killed mid-step: the others fail with an error within the timeout, the job ends",
     function()
    local timeout = 3
    local t0 = os.time()
    local out = L.sh(L.mpirun_prefix(3, "--enable-recovery", 60) .. "-x KILL_TIMEOUT=" .. timeout
                     .. " " .. (os.getenv("LUAJIT") or "luajit") .. " spec/dist/kill_rank.lua")
    local elapsed = os.time() - t0
    assert.matches("DIST%-KILLED rank 2", out)
    for r = 0, 1 do
      local line = out:match("DIST%-ERROR rank " .. r .. " [^\n]*")
      assert.is_truthy(line, "rank " .. r .. " reported no error:\n" .. out)
      assert.matches("did not complete within " .. timeout .. " s", line)
      local after = tonumber(line:match("after ([%d.]+) s"))
      assert.is_true(after >= timeout and after < timeout + 5, line)
    end
    assert.is_nil(out:match("DIST%-NOERROR"))
    assert.is_true(elapsed < 60, "the job took " .. elapsed .. " s to end")
  end)
end)

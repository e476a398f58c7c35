-- The call-graph cache of the CUDA backend (src/backend/cuda/call_graphs.c) on the host, against
-- a fake CUDA runtime that applies at each graph launch what the call's capture recorded
-- (spec/native/check_call_graphs.c, `make check-call-graphs`): first sighting direct, second
-- captured, later ones launched with the direct call's effect; keys told apart whole; eviction at
-- capacity; a failed capture; the capture-status query on a caller's stream only; a child graph
-- inside someone else's capture; lutra's own capture; the statistics. Needs the CUDA headers (no
-- GPU); pending without them.
local shell = require("spec.support.shell")

describe("the call-graph cache, on a fake CUDA runtime", function()
  if not shell.has_cuda_header("cublasLt.h") then
    pending("no CUDA headers: spec/native/check_call_graphs.c needs them (make check-call-graphs)")
    return
  end

  it("replays what a direct call does, and runs directly where it must", function()
    local ok, out = shell.build_and_run("build/check_call_graphs",
                                        "spec/native/check_call_graphs.c")
    assert.is_true(ok, out)
    assert.is_truthy(out:find("ok   freed caches destroy their graphs"), out)
    assert.is_nil(out:find("FAIL"), out)
    assert.is_truthy(out:find("\n0 failures"), out)
  end)
end)

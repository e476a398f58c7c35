-- Choosing a device: the CPU backend is always there; asking for cuda where it cannot run (a
-- build without CUDA, or no GPU) is a clear error, never a crash, and changes nothing.
local lutra = require("lutra")

describe("devices", function()
  it("cpu is always available", function()
    assert.is_true(lutra.device_available("cpu"))
  end)

  it("an unknown device name is an error that lists the known ones", function()
    assert.has_error(function() lutra.tensor({ 2, 2 }, "f32", "tpu") end,
      "lutra.tensor: unknown device 'tpu' (expected one of: cpu, cuda)")
  end)

  if not lutra.device_available("cuda") then
    it("asking for cuda without one is an error naming the call and the reason", function()
      local ok, err = pcall(lutra.tensor, { 2, 2 }, "f32", "cuda")
      assert.is_false(ok)
      assert.matches("^lutra_tensor_new: device 'cuda'", err)
      ok, err = pcall(lutra.nn.Linear, 16, 16, { device = "cuda" })
      assert.is_false(ok)
      assert.matches("lutra_linear_new: device 'cuda'", err)
      -- and the CPU backend still works afterwards
      local t = lutra.tensor({ 2, 2 }):fill(3)
      assert.are.same({ 3, 3, 3, 3 }, t:to_table())
    end)
  end
end)

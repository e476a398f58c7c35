-- Checking refused calls in specs: the message of a Lua error without Lua's "file.lua:NN: "
-- position, and an assertion that a call fails with "call: ..." containing a reason. Not a spec
-- itself (no _spec in its name).
local assert = require("luassert")

local M = {}

-- The message of fn's error without the position prefix, and the raw message.
function M.message_of(fn)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error, the call succeeded")
  local raw = tostring(err)
  return (raw:gsub("^[^%s:]+%.lua:%d+: ", "", 1)), raw
end

-- fn must fail with a message that starts with "call: " and contains reason (plain text).
function M.expect_error(fn, call, reason)
  local msg, raw = M.message_of(fn)
  assert.are.equal(call .. ": ", msg:sub(1, #call + 2),
                   string.format("error %q does not start with %q", raw, call .. ": "))
  if reason then
    assert.is_truthy(msg:find(reason, 1, true),
                     string.format("error %q does not contain %q", raw, reason))
  end
  return msg
end

-- A C call's status as a Lua error carrying lutra_last_error(), for cases that call ffi.C.
function M.c_check(st)
  if st ~= 0 then
    local lutra = require("lutra")
    error(lutra.ffi.string(lutra.C.lutra_last_error()), 0)
  end
end

-- One busted `it` per case { name, fn, call, reason }, each expecting fn to fail naming call and
-- containing reason; counter.n counts the cases that ran (a file checks its own total). it: the
-- calling spec file's busted `it` (each spec file has its own environment).
function M.cases(list, counter, it)
  for _, c in ipairs(list) do
    it(c[1], function()
      M.expect_error(c[2], c[3], c[4])
      counter.n = counter.n + 1
    end)
  end
end

return M

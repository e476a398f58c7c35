-- The forwards of a Linear with is_first_microbatch "device" around weight changes and
-- lutra.set_skip_weight_update, shared by spec/graph_state_spec.lua (cpu) and
-- spec/gpu/graph_state_gpu.lua (both devices). Run inside the caller's autocast scope.
local lutra = require("lutra")

local M = {}

-- a copy of t that later forwards do not overwrite
function M.keep(t)
  return lutra.tensor(t:dims(), t:dtype_name(), t:device_name()):copy(t)
end

-- y.first (flag clear), then the weight set to w_new: y.skipped (flag set), y.updated (flag
-- clear), then w_newer: y.skipped2 (flag set). The flag is left set.
function M.forwards(m, x, device, w_new, w_newer)
  local W = m:parameters()[1].value
  local y = {}
  lutra.set_skip_weight_update(device, false)
  y.first = M.keep(m:forward(x, "device"))
  W:set(w_new)
  lutra.set_skip_weight_update(device, true)
  y.skipped = M.keep(m:forward(x, "device"))
  lutra.set_skip_weight_update(device, false)
  y.updated = M.keep(m:forward(x, "device"))
  W:set(w_newer)
  lutra.set_skip_weight_update(device, true)
  y.skipped2 = M.keep(m:forward(x, "device"))
  return y
end

return M

-- x rounded to the nearest f32 (what storing it in a float does), for the specs' references:
-- local f32 = require("spec.support.f32"). One box, reused: no allocation per call.
local ffi = require("ffi")

local box = ffi.new("float[1]")

return function(x)
  box[0] = x
  return box[0]
end

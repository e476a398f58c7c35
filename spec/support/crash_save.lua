-- spec/checkpoint_spec.lua's crash: saves a model of about 2 MB to arg[1] (the caller limits the
-- file size, so the write dies or fails half-way), then prints "saved".
local lutra = require("lutra")
lutra.manual_seed(7)
local net = lutra.nn.Sequential(lutra.nn.Linear(512, 512), lutra.nn.Linear(512, 512))
local ok, err = pcall(lutra.save, arg[1], { model = net })
print(ok and "saved" or ("failed: " .. tostring(err)))

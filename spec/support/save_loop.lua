-- spec/checkpoint_bad_input_spec.lua's kill during a save: saves a model of about 32 MB to
-- arg[1] over and over until killed, so that a kill -9 at any moment most likely lands inside a
-- save (its temporary file half-written).
local lutra = require("lutra")
lutra.manual_seed(3)
local net = lutra.nn.Sequential(lutra.nn.Linear(2048, 2048), lutra.nn.Linear(2048, 2048))
io.write("ready\n")
io.flush()
while true do lutra.save(arg[1], { model = net }) end

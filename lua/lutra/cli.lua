--- Command-line scripts' helper (the examples and benchmarks): lua-argparse, or the line that
-- says how to install it; a device check before a script allocates. It loads neither the library
-- nor argparse until asked.
-- @module lutra.cli
local M = {}

-- A usage error (a bad value, a choice not offered, an unknown option) exits with status 2, the
-- shell's convention for a bad command line (argparse's own exit is 1, a run's failure).
local function usage_error(parser, msg)
  io.stderr:write(("%s\n\nError: %s\n"):format(parser:get_usage(), msg))
  os.exit(2)
end

--- lua-argparse's parser constructor for the script `name` (what its usage line shows, e.g.
-- "train_mlp.lua"); its parsers exit with status 2 on a usage error. Without lua-argparse it
-- writes "NAME needs lua-argparse (Debian: apt-get install lua-argparse)" on stderr and exits
-- with status 2: a script cannot run without its command line.
-- @string name the script's name
-- @tab[opt] opts `quiet`: exit without writing (the ranks of an mpirun other than the first)
-- @treturn function argparse's constructor, its parsers' error exit set to status 2
function M.argparse(name, opts)
  local found, argparse = pcall(require, "argparse")
  if found then
    return function(...)
      local parser = argparse(...)
      parser.error = usage_error
      return parser
    end
  end
  if not (opts and opts.quiet) then
    io.stderr:write(name, " needs lua-argparse (Debian: apt-get install lua-argparse)\n")
  end
  os.exit(2)
end

--- Exits with status 1, saying "NAME: cuda is not available (HINT)" on stderr, when device is
-- "cuda" and this build or machine cannot run it; returns otherwise. hint: what to use instead
-- (default "use --device cpu for a smoke test").
function M.need_device(name, device, hint)
  if device ~= "cuda" or require("lutra").device_available("cuda") then return end
  io.stderr:write(name, ": cuda is not available (", hint or "use --device cpu for a smoke test",
                  ")\n")
  os.exit(1)
end

return M

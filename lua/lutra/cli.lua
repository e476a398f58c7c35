--- Command-line scripts' helper (the examples and benchmarks): lua-argparse, or the line that
-- says how to install it. Pure Lua; it loads neither the library nor argparse until asked.
-- @module lutra.cli
local M = {}

--- lua-argparse's module for the script `name` (what its usage line shows, e.g.
-- "train_mlp.lua"). Without lua-argparse it writes "NAME needs lua-argparse (Debian: apt-get
-- install lua-argparse)" on stderr and exits with status 2: a script cannot run without its
-- command line. opts.quiet: exit without writing (the ranks of an mpirun other than the first).
function M.argparse(name, opts)
  local found, argparse = pcall(require, "argparse")
  if found then return argparse end
  if not (opts and opts.quiet) then
    io.stderr:write(name, " needs lua-argparse (Debian: apt-get install lua-argparse)\n")
  end
  os.exit(2)
end

return M

rockspec_format = "3.0"
package = "lutra"
version = "scm-1"
source = {
  url = "git+https://github.com/lutra-dev/lutra.git",
}
description = {
  summary = "FP8/BF16 training of linear layers from LuaJIT: recipes, autocast, quantizers, Linear",
  detailed = [[
lutra is a C11 runtime for low-precision training of linear layers, scripted from LuaJIT
through the FFI: TransformerEngine's recipes (delayed, current, MXFP8, block scaling), autocast
scopes, quantizers, GEMMs, Linear modules, losses and optimizers, at the cost of a C call.
]],
  license = "MIT",
  labels = { "luajit", "ffi", "fp8", "training" },
}
dependencies = {
  "lua == 5.1", -- LuaJIT
}
external_dependencies = {
  OPENBLAS = { library = "openblas" },
}
build = {
  type = "make",
  build_variables = {
    CFLAGS = "$(CFLAGS)",
  },
  install_target = "install-rock",
  install_variables = {
    PREFIX = "$(PREFIX)",
    LIBDIR = "$(LIBDIR)",
    LUADIR = "$(LUADIR)",
  },
}
test = {
  type = "command",
  command = "make test",
}

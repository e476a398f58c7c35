-- GEMM layouts in TransformerEngine's names, shared by the GEMM specs: for D [m, n] =
-- op(B) [m, k] op(A) [k, n], the stored shapes of A and B, their transpose flags and the
-- recipe roles a Linear quantizes them with. Not a spec itself (no _spec in its name).
local M = {}

M.LAYOUTS = {
  TN = { ta = true, tb = false, a = function(m, n, k) return { n, k } end,
         b = function(m, n, k) return { m, k } end, roles = { "weight", "input" } },
  NN = { ta = false, tb = false, a = function(m, n, k) return { k, n } end,
         b = function(m, n, k) return { m, k } end, roles = { "weight", "grad_output" } },
  NT = { ta = false, tb = true, a = function(m, n, k) return { k, n } end,
         b = function(m, n, k) return { k, m } end, roles = { "input", "grad_output" } },
}
M.ORDER = { "TN", "NN", "NT" }

return M

-- The figures of bench/host_overhead.lua: each a key, a name, the GPU work one call issues on
-- cuda (its floor), an optional target and a setup that returns the call to time; built for a
-- device and the script's shapes. Not a bench itself.
local unpack = table.unpack or unpack

return function(lutra, DEV, M, K, N, H)
  local nn = lutra.nn
  local CUDA = DEV == "cuda"
  -- work: the GPU work one call issues on cuda, from the code (src/nn/linear/linear.c, quantize.c,
  -- autocast.c, gemm.c, the kernels' launchers): launch = kernel launches, launch_big = launches
  -- with kilobytes of parameters (the multi-tensor optimizer), memset = cudaMemsetAsync, and the
  -- cublasLtMatmul calls by floor name. The floor of a figure is the sum of those raw floors.

  local function linear(inf, outf, seed, bias)
    return nn.Linear(inf, outf, { dtype = "bf16", device = DEV, seed = seed, bias = bias })
  end
  local function randn(rows, cols, seed) return lutra.tensor({ rows, cols }, "bf16", DEV):randn(seed) end


  -- the 4-layer MLP of the training-step figures: K -> H -> H -> H -> N, GELUs between, biases
  local function mlp()
    return nn.Sequential(linear(K, H, 1, true), nn.GELU(), linear(H, H, 2, true), nn.GELU(),
                         linear(H, H, 3, true), nn.GELU(), linear(H, N, 4, true))
  end
  local function mlp_work(fp8)
    -- the GEMMs, by epilogue (issued at the Linear shape): forward, 3 Linear+GELU pairs as
    -- GELU_AUX_BIAS and the last Linear with its BIAS; backward, the dgrads of Linears 4, 3, 2
    -- (none for the data input), with DGELU in BF16 (FP8 dgrad cannot take it: gelu' rides in the
    -- grad_output cast instead), and 4 wgrads, with BGRADB in BF16 (FP8: the cast sums the bias)
    local p = fp8 and "lt_fp8_" or "lt_bf16_"
    local g = {}
    local function add(kind, n) for _ = 1, n do g[#g + 1] = p .. kind end end
    add("fprop_gelu_aux_bias", 3)
    add("fprop_bias", 1)
    add(fp8 and "dgrad" or "dgrad_dgelu", 3)
    add(fp8 and "wgrad" or "wgrad_bgradb", 4)
    -- launches: MSE 1; FP8 adds, forward, a cast+transpose of x and of W per Linear and the
    -- scale update at exit; backward, a cast+transpose of dy per Linear (with gelu' and the bias
    -- gradient inside) and the backward scale update. AdamW: 1 multi-tensor launch.
    local launches = 1 + (fp8 and (8 + 1 + 4 + 1) or 0)
    return { launch = launches, launch_big = 1, matmul = g }
  end


  local figures = {
    { key = "autocast", name = "autocast enter+exit (Lua methods)", calls = 100000,
      work = {}, torch = "autocast", target = { kind = "abs", max = 0.05 },
      setup = function()
        local scope = lutra.autocast { recipe = lutra.recipe.delayed { amax_history_len = 16 } }
        return function() scope:enter() scope:exit() end
      end },
    { key = "linear_fwd_bf16", name = "Linear forward BF16", torch = "linear_fwd",
      work = { matmul = { "lt_bf16_fprop" } }, target = { kind = "floor", max = 1.15 },
      setup = function()
        local lin, x = linear(K, N, 1, false), randn(M, K, 1)
        return function() lin:forward(x) end
      end },
    { key = "linear_fwd_fp8_delayed", name = "Linear forward FP8 delayed (enter, forward, exit)",
      torch = "fp8_linear", target = { kind = "floor", max = 1.15 },
      -- cast+transpose of x and of W (one kernel each), the scale update at exit, the GEMM
      work = { launch = 3, matmul = { "lt_fp8_fprop" } },
      setup = function()
        local lin, x = linear(K, N, 1, false), randn(M, K, 1)
        local fp8 = lutra.autocast { recipe = lutra.recipe.delayed { amax_history_len = 16 } }
        return function() fp8:enter() lin:forward(x) fp8:exit() end
      end },
    -- the inference forward beside it: x and W cast rowwise only (no transposes), the same
    -- launch count; the options table is built once, outside the loop
    { key = "linear_fwd_fp8_delayed_infer",
      name = "Linear forward FP8 delayed, inference {grad = false} (enter, forward, exit)",
      torch = "fp8_linear", target = { kind = "floor", max = 1.15 },
      work = { launch = 3, matmul = { "lt_fp8_fprop" } },
      setup = function()
        local lin, x = linear(K, N, 1, false), randn(M, K, 1)
        local fp8 = lutra.autocast { recipe = lutra.recipe.delayed { amax_history_len = 16 } }
        local eval = { grad = false }
        return function() fp8:enter() lin:forward(x, eval) fp8:exit() end
      end },
    { key = "linear_fwd_fp8_current", name = "Linear forward FP8 current (enter, forward, exit)",
      torch = "fp8_linear", target = { kind = "floor", max = 1.15 },
      -- per tensor (x, W): amax and scale (one launch, no memset), cast+transpose; the GEMM
      work = { launch = 4, matmul = { "lt_fp8_fprop" } },
      setup = function()
        local lin, x = linear(K, N, 1, false), randn(M, K, 1)
        local fp8 = lutra.autocast { recipe = lutra.recipe.current() }
        return function() fp8:enter() lin:forward(x) fp8:exit() end
      end },
    { key = "linear_fwd_bf16_infer", name = "Linear forward BF16, inference {grad = false}",
      torch = "linear_fwd", work = { matmul = { "lt_bf16_fprop" } },
      target = { kind = "floor", max = 1.15 },
      setup = function()
        local lin, x = linear(K, N, 1, false), randn(M, K, 1)
        local eval = { grad = false }
        return function() lin:forward(x, eval) end
      end },
    { key = "linear_fwdbwd_bf16", name = "Linear forward+backward BF16", torch = "linear_fwdbwd",
      work = { matmul = { "lt_bf16_fprop", "lt_bf16_dgrad", "lt_bf16_wgrad" } },
      target = { kind = "floor", max = 1.2 },
      setup = function()
        local lin, x, dy = linear(K, N, 1, false), randn(M, K, 1), randn(M, N, 2)
        return function() lin:forward(x) lin:backward(dy) end
      end },
    { key = "linear_fwdbwd_fp8_delayed", name = "Linear forward+backward FP8 delayed",
      -- forward as above (3 launches), backward: cast+transpose of dy, the backward scale update
      work = { launch = 5, matmul = { "lt_fp8_fprop", "lt_fp8_dgrad", "lt_fp8_wgrad" } },
      setup = function()
        local lin, x, dy = linear(K, N, 1, false), randn(M, K, 1), randn(M, N, 2)
        local fp8 = lutra.autocast { recipe = lutra.recipe.delayed { amax_history_len = 16 } }
        return function() fp8:enter() lin:forward(x) fp8:exit() lin:backward(dy) end
      end },
    { key = "adamw_step", name = "AdamW step (the MLP's 8 tensors)", torch = "adamw_step",
      work = { launch_big = 1 },
      setup = function()
        local net = mlp()
        local opt_ = lutra.optim.AdamW(net, { lr = 1e-3, weight_decay = 0.01 })
        return function() opt_:step() end
      end },
    { key = "mlp_step_fp8_delayed", name = "MLP step FP8 delayed (4 Linear, MSE, AdamW)",
      torch = "mlp_step_fp8", target = { kind = "torch", max = 0.1 }, work = mlp_work(true),
      setup = function()
        local net, x, t = mlp(), randn(M, K, 1), randn(M, N, 3)
        local loss = nn.MSELoss()
        local opt_ = lutra.optim.AdamW(net, { lr = 1e-4, weight_decay = 0.01 })
        local fp8 = lutra.autocast { recipe = lutra.recipe.delayed { amax_history_len = 16 } }
        return function()
          fp8:enter()
          local y = net:forward(x)
          fp8:exit()
          loss:forward(y, t)
          net:backward(loss:backward(), false) -- x is data: no dgrad for the first Linear
          opt_:step()
        end
      end },
    -- the MLP's forward alone, training and inference side by side: 4 Linears, x and W cast per
    -- Linear (transposes in training only) and the scale update; 3 Linear+GELU pairs in the GEMM
    -- epilogue (GELU_AUX_BIAS in training; inference keeps no pre-activation: GELU_BIAS)
    { key = "mlp_fwd_fp8_delayed", name = "MLP forward FP8 delayed (4 Linear), training",
      work = { launch = 9, matmul = { "lt_fp8_fprop_gelu_aux_bias", "lt_fp8_fprop_gelu_aux_bias",
                                      "lt_fp8_fprop_gelu_aux_bias", "lt_fp8_fprop_bias" } },
      setup = function()
        local net, x = mlp(), randn(M, K, 1)
        local fp8 = lutra.autocast { recipe = lutra.recipe.delayed { amax_history_len = 16 } }
        return function() fp8:enter() net:forward(x) fp8:exit() end
      end },
    { key = "mlp_fwd_fp8_delayed_infer", name = "MLP forward FP8 delayed (4 Linear), inference",
      work = { launch = 9, matmul = { "lt_fp8_fprop_gelu_bias", "lt_fp8_fprop_gelu_bias",
                                      "lt_fp8_fprop_gelu_bias", "lt_fp8_fprop_bias" } },
      setup = function()
        local net, x = mlp(), randn(M, K, 1)
        local fp8 = lutra.autocast { recipe = lutra.recipe.delayed { amax_history_len = 16 } }
        local eval = { grad = false }
        return function() fp8:enter() net:forward(x, eval) fp8:exit() end
      end },
    { key = "mlp_step_bf16", name = "MLP step BF16 (4 Linear, MSE, AdamW)", torch = "mlp_step",
      target = { kind = "torch", max = 0.1 }, work = mlp_work(false),
      setup = function()
        local net, x, t = mlp(), randn(M, K, 1), randn(M, N, 3)
        local loss = nn.MSELoss()
        local opt_ = lutra.optim.AdamW(net, { lr = 1e-4, weight_decay = 0.01 })
        return function()
          loss:forward(net:forward(x), t)
          net:backward(loss:backward(), false) -- x is data: no dgrad for the first Linear
          opt_:step()
        end
      end },
  }

  -- the MLP step captured once as a CUDA graph (lutra.graph), replayed: one cudaGraphLaunch per
  -- step whatever the depth (cuda only)
  -- a deeper MLP (K -> H, `hidden` H -> H layers, H -> N), for the graph replay's depth check
  local function deep_mlp(hidden)
    local mods = { linear(K, H, 1, true), nn.GELU() }
    for i = 1, hidden do
      mods[#mods + 1] = linear(H, H, 1 + i, true)
      mods[#mods + 1] = nn.GELU()
    end
    mods[#mods + 1] = linear(H, N, hidden + 2, true)
    return nn.Sequential(unpack(mods))
  end

  local function graphed_mlp_step(fp8, hidden)
    return function()
      if not CUDA then return nil end
      local net, x, t = hidden and deep_mlp(hidden) or mlp(), randn(M, K, 1), randn(M, N, 3)
      local loss = nn.MSELoss()
      local opt_ = lutra.optim.AdamW(net, { lr = 1e-4, weight_decay = 0.01 })
      local scope = fp8 and lutra.autocast { recipe = lutra.recipe.delayed { amax_history_len = 16 } }
      local g = lutra.graph.capture(function()
        if scope then scope:enter() end
        local y = net:forward(x)
        if scope then scope:exit() end
        loss:forward(y, t)
        net:backward(loss:backward(), false) -- x is data: no dgrad for the first Linear
        opt_:step()
      end, { warmup = 2 })
      return function() g:replay() end
    end
  end
  figures[#figures + 1] = { key = "mlp_graph_fp8_delayed", torch = "mlp_step_fp8",
    name = "MLP step FP8 delayed, CUDA graph replay", target = { kind = "floor", max = 1.5 },
    work = { graph = 1 }, setup = graphed_mlp_step(true) }
  figures[#figures + 1] = { key = "mlp_graph_bf16", torch = "mlp_step",
    name = "MLP step BF16, CUDA graph replay", target = { kind = "floor", max = 1.5 },
    work = { graph = 1 }, setup = graphed_mlp_step(false) }
  figures[#figures + 1] = { key = "mlp16_graph_fp8_delayed",
    name = "16-Linear MLP step FP8 delayed, CUDA graph replay (depth check)",
    target = { kind = "floor", max = 1.5 }, work = { graph = 1 }, setup = graphed_mlp_step(true, 14) }

  -- ---- the norm-fused modules (src/nn/linear/layernorm_linear.c, layernorm_mlp.c) ---------------
  -- LayerNormLinear(in, out) without bias and LayerNormMLP(in -> hidden -> in, tanh GELU, biases),
  -- BF16 parameters. Launches from the code: the norm forward is 1 (FP8: the norm writes the GEMM's
  -- FP8 input and its columnwise copy, amax fused, in that 1), its backward 2 (dx with the
  -- dgamma/dbeta row-block partials, then their ordered sum; 3 above 8192 columns); per FP8 Linear as for nn.Linear (cast of W; backward: cast of dy with
  -- the bias gradient, and gelu' for FC1, whose forward GEMM ran the GELU in its epilogue); the
  -- delayed scale updates at the scope's exit and after the backward.
  local function ln_linear()
    return nn.LayerNormLinear(K, N, { dtype = "bf16", device = DEV, seed = 1, bias = false })
  end
  local function ln_mlp()
    return nn.LayerNormMLP(K, H, { dtype = "bf16", device = DEV, seed = 1, activation = "gelu" })
  end
  local function delayed() return lutra.autocast { recipe = lutra.recipe.delayed { amax_history_len = 16 } } end
  local fused_figures = {
    { key = "lnlinear_fwd_bf16", name = "LayerNormLinear forward BF16", torch = "ln_linear_fwd",
      target = { kind = "floor", max = 1.15 },
      work = { launch = 1, matmul = { "lt_bf16_fprop" } },
      setup = function()
        local m, x = ln_linear(), randn(M, K, 1)
        return function() m:forward(x) end
      end },
    { key = "lnlinear_fwd_fp8_delayed", name = "LayerNormLinear forward FP8 delayed (enter, forward, exit)",
      torch = "ln_linear_fwd", target = { kind = "floor", max = 1.15 },
      -- the norm writing FP8 x rowwise + columnwise, the cast of W, the scale update at exit
      work = { launch = 3, matmul = { "lt_fp8_fprop" } },
      setup = function()
        local m, x, fp8 = ln_linear(), randn(M, K, 1), delayed()
        return function() fp8:enter() m:forward(x) fp8:exit() end
      end },
    { key = "lnlinear_fwdbwd_bf16", name = "LayerNormLinear forward+backward BF16",
      torch = "ln_linear_fwdbwd", target = { kind = "floor", max = 1.15 },
      work = { launch = 3, matmul = { "lt_bf16_fprop", "lt_bf16_dgrad", "lt_bf16_wgrad" } },
      setup = function()
        local m, x, dy = ln_linear(), randn(M, K, 1), randn(M, N, 2)
        return function() m:forward(x) m:backward(dy) end
      end },
    { key = "lnlinear_fwdbwd_fp8_delayed", name = "LayerNormLinear forward+backward FP8 delayed",
      torch = "ln_linear_fwdbwd", target = { kind = "floor", max = 1.15 },
      -- forward 3 as above; backward: cast of dy, the norm's 2, the backward scale update
      work = { launch = 7, matmul = { "lt_fp8_fprop", "lt_fp8_dgrad", "lt_fp8_wgrad" } },
      setup = function()
        local m, x, dy, fp8 = ln_linear(), randn(M, K, 1), randn(M, N, 2), delayed()
        return function() fp8:enter() m:forward(x) fp8:exit() m:backward(dy) end
      end },
    { key = "lnmlp_fwd_bf16", name = "LayerNormMLP forward BF16 (GELU in FC1's epilogue)",
      torch = "ln_mlp_fwd", target = { kind = "floor", max = 1.15 },
      work = { launch = 1, matmul = { "lt_bf16_fprop_gelu_aux_bias", "lt_bf16_fprop_bias" } },
      setup = function()
        local m, x = ln_mlp(), randn(M, K, 1)
        return function() m:forward(x) end
      end },
    { key = "lnmlp_fwdbwd_bf16", name = "LayerNormMLP forward+backward BF16",
      torch = "ln_mlp_fwdbwd", target = { kind = "floor", max = 1.15 },
      -- GEMMs: FC1 GELU_AUX_BIAS, FC2 BIAS; FC2's dgrad with DGELU, both wgrads with BGRADB
      work = { launch = 3, matmul = { "lt_bf16_fprop_gelu_aux_bias", "lt_bf16_fprop_bias",
        "lt_bf16_dgrad_dgelu", "lt_bf16_wgrad_bgradb", "lt_bf16_dgrad", "lt_bf16_wgrad_bgradb" } },
      setup = function()
        local m, x, dy = ln_mlp(), randn(M, K, 1), randn(M, K, 2)
        return function() m:forward(x) m:backward(dy) end
      end },
    { key = "lnmlp_fwdbwd_fp8_delayed", name = "LayerNormMLP forward+backward FP8 delayed",
      torch = "ln_mlp_fwdbwd", target = { kind = "floor", max = 1.15 },
      -- forward 5: norm -> FP8 x (+ columnwise), cast W1, cast of FC2's input, cast W2, scale update;
      -- backward 5: cast of dy (FC2's dbias), cast of gelu'-applied dh (FC1's dbias), the norm's 2,
      -- the backward scale update; GEMMs: FC1 with GELU_AUX_BIAS, FC2 with BIAS, 2 dgrads, 2 wgrads
      work = { launch = 10, matmul = { "lt_fp8_fprop_gelu_aux_bias", "lt_fp8_fprop_bias",
        "lt_fp8_dgrad", "lt_fp8_wgrad", "lt_fp8_dgrad", "lt_fp8_wgrad" } },
      setup = function()
        local m, x, dy, fp8 = ln_mlp(), randn(M, K, 1), randn(M, K, 2), delayed()
        return function() fp8:enter() m:forward(x) fp8:exit() m:backward(dy) end
      end },
  }
  for _, fig in ipairs(fused_figures) do figures[#figures + 1] = fig end

  local function work_ops(w)
    return (w.launch or 0) + (w.launch_big or 0) + (w.memset or 0) + (w.memcpy or 0) + #(w.matmul or {})
  end
  for _, fig in ipairs(figures) do fig.ops = math.max(1, work_ops(fig.work)) end
  return figures
end

/* Runs the MoE routing kernels (kernels/moe/moe.cu: router, counting-sort permute, combines and
 * backwards) on the CPU, one std::thread per CUDA thread, and compares every output with the
 * CPU backend (src/backend/cpu/moe_cpu.c): for checking the kernels' indexing, warp matching,
 * scans and barriers on a machine without a GPU. The host's exp is the CPU backend's, so here
 * even the router's probabilities and gradients must agree bit for bit; only dprobs (exact
 * products summed in double in another order) gets a bound of 2^-22 relative. The grid cap is
 * 8 blocks, so every grid-stride loop loops.
 *
 *   make CUDA=0 && make sim-moe    (build/sim_moe, run by the target; ARGS=quick: two cases) */
#include "sim_harness.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#define LKM_LAUNCH   SIM_LAUNCH
#define LKM_MAX_GRID 8
#define LKM_SIM      1

#include "moe/moe.cu"

/* ---- the check ------------------------------------------------------------------------------ */

#include "sim_cpu.h"

static int failures = 0, checks = 0;

template <typename T>
static void same(const char *what, const std::vector<T> &cpu, const std::vector<T> &sim) {
  checks++;
  if (memcmp(cpu.data(), sim.data(), cpu.size() * sizeof(T)) == 0) return;
  for (size_t i = 0; i < cpu.size(); i++) {
    if (memcmp(&cpu[i], &sim[i], sizeof(T)) != 0) {
      printf("FAIL %s: element %zu differs (of %zu)\n", what, i, cpu.size());
      break;
    }
  }
  failures++;
}

/* n values of dtype dt (16-byte padded buffer), normal * scale, some rows tied */
static std::vector<unsigned char> values(int dt, int64_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<unsigned char> v((size_t)(n * sim_esize(dt) + 16));
  for (int64_t i = 0; i < n; i++) {
    float f = nd(rng) * scale;
    if (i % 97 < 3) f = 0.75f; /* ties */
    sim_put(v, dt, i, f);
  }
  return v;
}

static void check_router(int64_t T, int E, int k, int renorm, int dt, float scale) {
  char what[160];
  snprintf(what, sizeof what, "router T=%lld E=%d k=%d renorm=%d dt=%d", (long long)T, E, k, renorm,
           dt);
  const auto logits = values(dt, T * E, 2.0f, (uint32_t)(T + E + k));
  std::vector<float> p_cpu(T * k, NAN), p_sim(T * k, NAN);
  std::vector<int32_t> i_cpu(T * k, -7), i_sim(T * k, -7);
  lutra_topk_args a = {};
  a.logits = logits.data();
  a.dtype = dt;
  a.k = k;
  a.tokens = T;
  a.experts = E;
  a.renormalize = renorm;
  a.scaling_factor = scale;
  a.probs = p_cpu.data();
  a.indices = i_cpu.data();
  if (cpu::lutra_cpu_moe_topk_forward(&a) != 0) abort();
  a.probs = p_sim.data();
  a.indices = i_sim.data();
  lk_moe_topk_forward(&a, nullptr);
  same((std::string(what) + " indices").c_str(), i_cpu, i_sim);
  same((std::string(what) + " probs").c_str(), p_cpu, p_sim);
  const auto g = values(LUTRA_F32, T * k, 1.0f, 5);
  std::vector<unsigned char> d_cpu(T * E * sim_esize(dt), 0xEE), d_sim(T * E * sim_esize(dt), 0xDD);
  a.indices = i_cpu.data();
  a.dprobs = reinterpret_cast<const float *>(g.data());
  a.dlogits = d_cpu.data();
  if (cpu::lutra_cpu_moe_topk_backward(&a) != 0) abort();
  a.dlogits = d_sim.data();
  lk_moe_topk_backward(&a, nullptr);
  same((std::string(what) + " dlogits").c_str(), d_cpu, d_sim);
}

static void check_permute(int64_t T, int k, int E, int64_t H, int dt, int routing, bool bad) {
  char what[160];
  snprintf(what, sizeof what, "permute T=%lld k=%d E=%d H=%lld dt=%d routing=%d%s", (long long)T, k,
           E, (long long)H, dt, routing, bad ? " (a bad index)" : "");
  const int64_t n = T * k;
  std::mt19937 rng((uint32_t)(T * 31 + E));
  std::vector<int32_t> idx(n);
  for (int64_t s = 0; s < n; s++) {
    const int32_t r = (int32_t)(rng() % (uint32_t)E);
    idx[s] = routing == 0 ? r : routing == 1 ? (s % 5 ? 0 : r % 3) : E - 1;
  }
  if (bad) idx[n / 2] = E;
  const size_t es = (size_t)sim_esize(dt);
  const auto x = values(dt, T * H, 1.0f, 1), xe = values(dt, n * H, 1.0f, 2),
             dy = values(dt, T * H, 1.0f, 3), probs = values(LUTRA_F32, n, 0.5f, 4);
  lutra_permute_args a = {};
  a.tokens = T;
  a.k = k;
  a.experts = E;
  a.hidden = H;
  a.dtype = dt;
  a.probs_dtype = LUTRA_F32;
  a.indices = idx.data();
  std::vector<int32_t> map_cpu(n, -7), map_sim(n, -7), sp_cpu(E, -7), sp_sim(E, -7);
  std::vector<int32_t> scratch((size_t)lutra_moe_scratch_ints(n, E), 0x5A5A5A5A);
  std::vector<unsigned char> out_cpu(n * H * es + 16, 0xEE), out_sim(n * H * es + 16, 0xEE);
  int32_t flag = 0;
  a.scratch = scratch.data();
  a.x = x.data();
  if (bad) {
    /* the CPU refuses the call: the reference is a plain count of the good slots */
    std::vector<int32_t> off(E, 0);
    std::fill(sp_cpu.begin(), sp_cpu.end(), 0);
    for (int64_t s = 0; s < n; s++)
      if (idx[s] >= 0 && idx[s] < E) sp_cpu[idx[s]]++;
    for (int e = 1; e < E; e++)
      off[e] = off[e - 1] + sp_cpu[e - 1];
    for (int64_t s = 0; s < n; s++)
      map_cpu[s] = idx[s] >= 0 && idx[s] < E ? off[idx[s]]++ : -1;
  } else {
    a.row_map = map_cpu.data();
    a.m_splits = sp_cpu.data();
    a.out = out_cpu.data();
    if (cpu::lutra_cpu_moe_permute(&a) != 0) abort();
  }
  a.row_map = map_sim.data();
  a.m_splits = sp_sim.data();
  a.out = out_sim.data();
  a.bad_index = &flag;
  lk_moe_permute(&a, nullptr);
  same((std::string(what) + " m_splits").c_str(), sp_cpu, sp_sim);
  checks++;
  if (flag != (bad ? 1 : 0)) {
    printf("FAIL %s: bad-index flag %d\n", what, flag);
    failures++;
  }
  same((std::string(what) + " row_map").c_str(), map_cpu, map_sim);
  if (bad) return;
  same((std::string(what) + " permuted").c_str(), out_cpu, out_sim);

  /* the combines and the unpermute backward, on the (same) row map */
  a.row_map = map_cpu.data();
  a.probs = probs.data();
  std::vector<unsigned char> y_cpu(T * H * es + 16, 0xEE), y_sim(T * H * es + 16, 0xEE);
  for (int weighted = 0; weighted < 2; weighted++) {
    a.x = xe.data();
    a.out = y_cpu.data();
    if ((weighted ? cpu::lutra_cpu_moe_unpermute(&a) : cpu::lutra_cpu_moe_permute_backward(&a)) !=
        0)
      abort();
    a.out = y_sim.data();
    if (weighted)
      lk_moe_unpermute(&a, nullptr);
    else
      lk_moe_permute_backward(&a, nullptr);
    same((std::string(what) + (weighted ? " unpermute" : " permute_backward")).c_str(), y_cpu,
         y_sim);
  }
  std::vector<unsigned char> dx_cpu(n * H * es + 16, 0xEE), dx_sim(n * H * es + 16, 0xEE);
  std::vector<float> dp_cpu(n, NAN), dp_sim(n, NAN);
  a.x = xe.data();
  a.dy = dy.data();
  a.out = dx_cpu.data();
  a.dprobs = dp_cpu.data();
  if (cpu::lutra_cpu_moe_unpermute_backward(&a) != 0) abort();
  a.out = dx_sim.data();
  a.dprobs = dp_sim.data();
  lk_moe_unpermute_backward(&a, nullptr);
  same((std::string(what) + " dexpert_out").c_str(), dx_cpu, dx_sim);
  checks++;
  for (int64_t s = 0; s < n; s++) {
    if (!(std::fabs(dp_cpu[s] - dp_sim[s]) <= std::ldexp(std::fabs(dp_cpu[s]), -22) + 1e-30)) {
      printf("FAIL %s dprobs: slot %lld cpu %.9g sim %.9g\n", what, (long long)s, dp_cpu[s],
             dp_sim[s]);
      failures++;
      break;
    }
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "quick") == 0) { /* one router and one permute case */
    check_router(150, 40, 3, 0, LUTRA_BF16, 2.5f);
    check_permute(700, 3, 37, 12, LUTRA_F32, 0, false);
    printf("%d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
  }
  for (int dt : {LUTRA_F32, LUTRA_BF16, LUTRA_F16})
    for (int k : {1, 2, 3, 8})
      for (int renorm : {0, 1})
        check_router(150, 40, k, renorm, dt, k == 3 ? 2.5f : 1.0f);
  check_router(70, 4096, 4, 0, LUTRA_F32, 1.0f);
  check_router(65, 1, 1, 1, LUTRA_F32, 1.0f);
  check_permute(700, 3, 37, 12, LUTRA_F32, 0, false); /* 3 chunks, vector rows */
  check_permute(345, 2, 5, 5, LUTRA_BF16, 0, false);  /* unaligned rows */
  check_permute(1100, 1, 300, 8, LUTRA_BF16, 0, false);
  check_permute(600, 4, 8, 16, LUTRA_F16, 1, false); /* skewed, empty experts */
  check_permute(300, 8, 16, 6, LUTRA_F32, 2, false); /* everything to the last expert */
  check_permute(9, 2, 4096, 4, LUTRA_F32, 0, false); /* experts beyond the scan's threads */
  check_permute(520, 2, 6, 4, LUTRA_F32, 0, true);
  printf("%d checks, %d failures\n", checks, failures);
  return failures ? 1 : 0;
}

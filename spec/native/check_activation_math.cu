/* kernels/activation/activation_math.cuh's element formulas, compiled for the host, against the CPU
 * backend's activation entries (src/backend/cpu/activation_cpu.c), bit for bit: on the host
 * both call libm's expf and erff, so any difference is an operation out of order, a constant
 * folded differently or a tail case missed. On the device only expf/erff themselves differ
 * (spec/gpu/activation_gpu.lua bounds that). One exception: the CPU's Tanh forward is glibc's
 * four-lane tanhf (libmvec) where present, at most 4 ulp from libm's tanhf by glibc's table, the
 * bound held here (its backward, through expf, stays bit for bit). No GPU needed.
 *
 *   make CUDA=0 && make check-activations    (nvcc, host code only) */
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "activation/activation_math.cuh"

extern "C" {
#include "backend/cpu/cpu.h"
}

using namespace lkc;

static std::vector<float> values() {
  std::vector<float> v = {0.0f,    -0.0f,  1.0f,    -1.0f,   INFINITY, -INFINITY,
                          NAN,     1e-40f, -1e-40f, 88.0f,   -88.0f,   100.0f,
                          -100.0f, 1e30f,  -1e30f,  3.4e38f, -3.4e38f};
  std::mt19937 g(1);
  std::normal_distribution<float> n(0.0f, 3.0f);
  for (int i = 0; i < 200000; i++)
    v.push_back(n(g));
  std::uniform_real_distribution<float> u(-120.0f, 120.0f);
  for (int i = 0; i < 100000; i++)
    v.push_back(u(g));
  return v;
}

static bool same(float a, float b) {
  return std::memcmp(&a, &b, 4) == 0 || (std::isnan(a) && std::isnan(b));
}

/* the distance in ulps of two finite floats of one sign (NaNs and infinities: 0 when the same) */
static int64_t ulps(float a, float b) {
  if (same(a, b)) return 0;
  if (!std::isfinite(a) || !std::isfinite(b) || std::signbit(a) != std::signbit(b))
    return INT64_MAX;
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return ia > ib ? (int64_t)ia - ib : (int64_t)ib - ia;
}

/* fwd_ulps: how far the CPU's forward may be from the kernel formula's (0: bit for bit) */
template <class K> static int check(int act, const std::vector<float> &x, int fwd_ulps = 0) {
  const int64_t n = (int64_t)x.size();
  std::vector<float> dy(x.size()), y(x.size()), dx(x.size());
  std::mt19937 g(2);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto &d : dy)
    d = nd(g);
  int bad = 0;
  int64_t worst = 0; /* the forward's largest distance seen, in ulps */
  if (lutra_act_is_gated(act)) {
    /* one row of 2h: gate a = x[:h], linear b = x[h:] */
    const int64_t h = n / 2;
    lutra_act_args a = {x.data(), nullptr, y.data(), LUTRA_F32, act, 0, 1, 2 * h};
    lutra_cpu_activation_forward(&a);
    lutra_act_args b = {x.data(), dy.data(), dx.data(), LUTRA_F32, act, 0, 1, 2 * h};
    lutra_cpu_activation_backward(&b);
    for (int64_t j = 0; j < h && bad < 5; j++) {
      const float ga = x[j], lb = x[h + j], d = dy[j];
      const float fy = fmul(K::f(ga), lb), da = fmul(fmul(d, lb), K::df(ga)),
                  db = fmul(d, K::f(ga));
      if (!same(fy, y[j]) || !same(da, dx[j]) || !same(db, dx[h + j])) {
        std::printf("kind %d a=%.9g b=%.9g: kernel %.9g %.9g %.9g, cpu %.9g %.9g %.9g\n", act, ga,
                    lb, fy, da, db, y[j], dx[j], dx[h + j]);
        bad++;
      }
    }
  } else {
    lutra_act_args a = {x.data(), nullptr, y.data(), LUTRA_F32, act, n, 0, 0};
    lutra_cpu_activation_forward(&a);
    lutra_act_args b = {x.data(), dy.data(), dx.data(), LUTRA_F32, act, n, 0, 0};
    lutra_cpu_activation_backward(&b);
    for (int64_t i = 0; i < n && bad < 5; i++) {
      const float fy = K::f(x[i]), fd = fmul(dy[i], K::df(x[i]));
      const int64_t u = ulps(fy, y[i]);
      if (u > worst) worst = u;
      if (u > fwd_ulps || !same(fd, dx[i])) {
        std::printf("kind %d x=%.9g: kernel %.9g %.9g, cpu %.9g %.9g\n", act, x[i], fy, fd, y[i],
                    dx[i]);
        bad++;
      }
    }
  }
  if (bad)
    std::printf("kind %d: DIFFERS\n", act);
  else if (worst)
    std::printf("kind %d: backward bit-identical, forward within %d ulp (%lld seen)\n", act,
                fwd_ulps, (long long)worst);
  else
    std::printf("kind %d: bit-identical\n", act);
  return bad;
}

int main() {
  const std::vector<float> x = values();
  int bad = 0;
  bad += check<ActGeluTanh>(LUTRA_ACT_GELU_TANH, x);
  bad += check<ActRelu>(LUTRA_ACT_RELU, x);
  bad += check<ActSig<false>>(LUTRA_ACT_SILU, x);
  bad += check<ActSig<true>>(LUTRA_ACT_QGELU, x);
  bad += check<ActSrelu>(LUTRA_ACT_SRELU, x);
  bad += check<ActGeluErf>(LUTRA_ACT_GELU_ERF, x);
  bad += check<ActSig<false>>(LUTRA_ACT_SWIGLU, x);
  bad += check<ActGeluTanh>(LUTRA_ACT_GEGLU, x);
  bad += check<ActRelu>(LUTRA_ACT_REGLU, x);
  bad += check<ActTanh>(LUTRA_ACT_TANH, x, 4);
  return bad ? 1 : 0;
}

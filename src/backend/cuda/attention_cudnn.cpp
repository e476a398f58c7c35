/* The CUDA backend's scaled dot-product attention (backend.h's attention entries, declared in
 * cuda_backend.h): cuDNN's fused flash attention through cudnn-frontend's graph API. The only
 * C++ in src/: nothing here throws past the C functions at the bottom, each of which turns an
 * exception or a cuDNN error into a lutra status naming the call and cuDNN's message.
 *
 * cuDNN is found at run time, not at link time: cudnn-frontend is built with its dynamic loading
 * (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING), which looks every cuDNN function up in the handle
 * cudnn_frontend::cudnn_dlhandle that open_cudnn sets. So liblutra.so runs without cuDNN for
 * everything but attention, which then refuses naming every place it looked.
 * A plan (one per shape, dtype, mask and dropout; the module caches them) holds the forward and
 * the backward graphs, built and with their execution plans chosen (heuristics A, then the
 * fallback list), their workspace size and their variant packs (tensor uid -> device pointer),
 * each made once: a call stores its pointers into the pack's slots and executes, building
 * nothing and allocating nothing. A plan is used by one thread at a time (its packs are
 * rewritten per call), as a module is. As a cuBLASLt call is, an execute that comes again with
 * the same pointers is replayed as the CUDA graph of its kernels (call_graphs.c, one cache per
 * plan and direction, of the GEMM kind: LUTRA_GEMM_GRAPHS=0 turns it off): a graph launch costs
 * the host a fraction of what cuDNN's execute does. FP8 plans (a->fp8) are built from the graphs
 * of attention_cudnn_fp8.cpp and run through the same calls, their scales read from the
 * module's state. */
#include "backend/cuda/attention_cudnn.h"
#include "kernels.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <mutex>
#include <new>
#include <sys/stat.h>

/* cudnn-frontend's dynamic loading resolves cuDNN's symbols in this handle (set by open_cudnn
 * before any cudnn-frontend call: its lookups are cached at their first use) */
void *cudnn_frontend::cudnn_dlhandle = nullptr;

namespace {

using namespace lutra_cudnn;

/* ---- finding cuDNN ------------------------------------------------------------------------- */

/* Folders searched after LUTRA_CUDNN_PATH and the loader's default search path, ':'-separated:
 * the Makefile bakes python3's site-packages nvidia/cudnn/lib (PyTorch's and PyPI's cuDNN) and
 * the CUDA install's library folders in. */
#ifndef LUTRA_CUDNN_FALLBACK_DIRS
#define LUTRA_CUDNN_FALLBACK_DIRS ""
#endif
constexpr const char *cudnn_soname = "libcudnn.so.9";

enum { LOAD_UNTRIED, LOAD_OK, LOAD_FAILED };
std::atomic<int> load_state{LOAD_UNTRIED};
std::mutex load_lock;
int load_status = LUTRA_OK;
std::string load_message;

void *try_open(const std::string &path, std::string &tried) {
  dlerror();
  void *h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *why = dlerror();
    tried += "\n  " + path + ": " + (why ? why : "not loadable");
  }
  return h;
}

bool is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

std::string in_dir(const std::string &dir) {
  return dir + (dir.empty() || dir.back() == '/' ? "" : "/") + cudnn_soname;
}

/* The version checks once a library is open: cuDNN 9 or newer, built for this CUDA major (a
 * cuDNN of another CUDA major would start a runtime of its own). */
bool check_version(void *h, const std::string &where, std::string &why) {
  using version_fn = size_t (*)(void);
  auto version = reinterpret_cast<version_fn>(dlsym(h, "cudnnGetVersion"));
  auto cudart = reinterpret_cast<version_fn>(dlsym(h, "cudnnGetCudartVersion"));
  if (!version || !cudart) {
    why = where + " has no cudnnGetVersion / cudnnGetCudartVersion: not a cuDNN library";
    return false;
  }
  const size_t v = version(), c = cudart();
  if (v < 90000) {
    why = where + " is cuDNN " + std::to_string(v) + ": lutra needs cuDNN 9.0 or newer";
    return false;
  }
  if (c / 1000 != CUDART_VERSION / 1000) {
    why = where + " is a cuDNN for CUDA " + std::to_string(c / 1000) + ", lutra runs CUDA " +
          std::to_string(CUDART_VERSION / 1000) + " (pip's nvidia-cudnn-cu" +
          std::to_string(CUDART_VERSION / 1000) + " has the matching one)";
    return false;
  }
  return true;
}

void load_once() {
  std::string tried;
  void *h = nullptr;
  /* LUTRA_CUDNN_PATH, when set, is the only place tried: a library the user named that does not
   * load is an error, not a reason to take another cuDNN from elsewhere */
  const char *env = std::getenv("LUTRA_CUDNN_PATH");
  if (env && *env) {
    h = try_open(is_dir(env) ? in_dir(env) : std::string(env), tried);
    if (!h) {
      load_status = LUTRA_EUNSUPPORTED;
      load_message = std::string("cuDNN 9 was not loaded from LUTRA_CUDNN_PATH=") + env + ":" +
                     tried + "\n(point it at " + cudnn_soname + " or its folder, or unset it)";
      return;
    }
  }
  if (!h) h = try_open(cudnn_soname, tried);
  const std::string dirs = LUTRA_CUDNN_FALLBACK_DIRS;
  for (size_t at = 0; !h && at < dirs.size();) {
    size_t end = dirs.find(':', at);
    if (end == std::string::npos) end = dirs.size();
    if (end > at) h = try_open(in_dir(dirs.substr(at, end - at)), tried);
    at = end + 1;
  }
  if (!h) {
    load_status = LUTRA_EUNSUPPORTED;
    load_message =
        std::string("cuDNN 9 (") + cudnn_soname + ") was not found; tried:" + tried +
        "\n(set LUTRA_CUDNN_PATH to the library or its folder, e.g. the nvidia/cudnn/lib "
        "of a Python environment with PyTorch or nvidia-cudnn-cu13)";
    return;
  }
  std::string why;
  if (!check_version(h, "the cuDNN found", why)) {
    dlclose(h);
    load_status = LUTRA_EUNSUPPORTED;
    load_message = why;
    return;
  }
  cudnn_frontend::cudnn_dlhandle = h;
  /* cudnn-frontend opens the CUDA runtime too, trying libcudart.so.12 then .13 and taking the
   * first found: name the one lutra is linked with (already loaded, so this opens nothing new),
   * unless the user chose one */
  const std::string cudart = "libcudart.so." + std::to_string(CUDART_VERSION / 1000);
  setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", cudart.c_str(), 0);
}

int open_cudnn(const char *fn) {
  if (load_state.load(std::memory_order_acquire) == LOAD_OK) return LUTRA_OK;
  std::lock_guard<std::mutex> guard(load_lock);
  if (load_state.load(std::memory_order_relaxed) == LOAD_UNTRIED) {
    load_once();
    load_state.store(load_status == LUTRA_OK ? LOAD_OK : LOAD_FAILED, std::memory_order_release);
  }
  if (load_status != LUTRA_OK) return lutra_error(load_status, fn, "%s", load_message.c_str());
  return LUTRA_OK;
}

/* ---- cuDNN handles: one per thread --------------------------------------------------------- */

int cudnn_status(cudnnStatus_t s, const char *fn, const char *what) {
  if (s == CUDNN_STATUS_SUCCESS) return LUTRA_OK;
  const std::string detail = fe::detail::get_last_error_string_();
  return lutra_error(LUTRA_EBACKEND, fn, "%s: %s%s%s", what, fe::detail::get_error_string(s),
                     detail.empty() ? "" : ": ", detail.c_str());
}

/* Handles of exited threads, taken by later threads before they make new ones: never destroyed,
 * as context_cuda.c keeps cuBLASLt's (a handle destroyed while another thread captured a graph
 * crashed in the driver there). Leaked on purpose: thread exits may come after static
 * destructors at process exit. */
std::mutex &spare_lock = *new std::mutex;
std::vector<cudnnHandle_t> &spare_handles = *new std::vector<cudnnHandle_t>;

struct thread_handle {
  cudnnHandle_t handle = nullptr;
  cudaStream_t stream = nullptr; /* the stream last set on handle */
  ~thread_handle() {
    if (!handle) return;
    std::lock_guard<std::mutex> guard(spare_lock);
    spare_handles.push_back(handle);
  }
};
thread_local thread_handle this_thread;

/* This thread's handle, made at its first attention call (a plan: never inside a capture), set
 * to lutra's current stream so that its work is ordered with lutra's and captured with it. */
int handle_for_stream(const char *fn, cudnnHandle_t *out) {
  thread_handle &t = this_thread;
  if (!t.handle) {
    {
      std::lock_guard<std::mutex> guard(spare_lock);
      if (!spare_handles.empty()) {
        t.handle = spare_handles.back();
        spare_handles.pop_back();
      }
    }
    if (!t.handle) {
      TRY(lutra_cuda_refuse_in_capture(fn, "creating this thread's cuDNN handle"));
      cudnnHandle_t h = nullptr;
      TRY(cudnn_status(fe::detail::create_handle(&h), fn, "cudnnCreate"));
      t.handle = h;
    }
    t.stream = nullptr;
  }
  cudaStream_t s = lutra_cuda_stream();
  if (t.stream != s || !s) {
    TRY(cudnn_status(fe::detail::set_stream(t.handle, s), fn, "cudnnSetStream"));
    t.stream = s;
  }
  *out = t.handle;
  return LUTRA_OK;
}

/* ---- the plan ------------------------------------------------------------------------------ */

std::shared_ptr<fe::graph::Graph> new_graph(const lutra_attention_args *a) {
  return graph_of(a->dtype == LUTRA_BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF);
}

fe::error_t build(fe::graph::Graph &g, cudnnHandle_t h) {
  return g.build(h, {fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
}

std::shared_ptr<fe::graph::Graph> forward_graph(const lutra_attention_args *a) {
  auto g = new_graph(a);
  auto q = input(*g, "Q", Q, bhsd(a->b, a->h, a->s_q, a->d), a->q_stride);
  auto k = input(*g, "K", K, bhsd(a->b, a->h_kv, a->s_kv, a->d), a->k_stride);
  auto v = input(*g, "V", V, bhsd(a->b, a->h_kv, a->s_kv, a->d), a->v_stride);
  auto options = fe::graph::SDPA_attributes().set_name("lutra_attention").set_generate_stats(true);
  common_options(options, a, *g);
  auto [o, stats] = g->sdpa(q, k, v, options);
  output(o, O, bhsd(a->b, a->h, a->s_q, a->d), a->o_stride);
  stats_layout(*stats, a).set_output(true);
  return g;
}

std::shared_ptr<fe::graph::Graph> backward_graph(const lutra_attention_args *a,
                                                 bool deterministic) {
  auto g = new_graph(a);
  auto q = input(*g, "Q", Q, bhsd(a->b, a->h, a->s_q, a->d), a->q_stride);
  auto k = input(*g, "K", K, bhsd(a->b, a->h_kv, a->s_kv, a->d), a->k_stride);
  auto v = input(*g, "V", V, bhsd(a->b, a->h_kv, a->s_kv, a->d), a->v_stride);
  auto o = input(*g, "O", O, bhsd(a->b, a->h, a->s_q, a->d), a->o_stride);
  auto dout = input(*g, "dO", DO, bhsd(a->b, a->h, a->s_q, a->d), a->o_stride);
  fe::graph::Tensor_attributes stats_in;
  auto stats = g->tensor(stats_layout(stats_in, a));
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("lutra_attention_backward")
                     .set_deterministic_algorithm(deterministic);
  common_options(options, a, *g);
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, options);
  output(dq, DQ, bhsd(a->b, a->h, a->s_q, a->d), a->q_stride);
  output(dk, DK, bhsd(a->b, a->h_kv, a->s_kv, a->d), a->k_stride);
  output(dv, DV, bhsd(a->b, a->h_kv, a->s_kv, a->d), a->v_stride);
  return g;
}

/* Whether to ask for the deterministic backward: always under the determinism switch
 * (a->deterministic, which also forbids falling back to the other), else unless
 * LUTRA_CUDNN_DETERMINISTIC=0, read at each plan build (rare), so that a process can compare
 * both. On Hopper cuDNN serves it through a dP workspace of b * h * s_q * s_kv * 2 bytes: it
 * costs memory as well as some speed. */
bool want_deterministic(const lutra_attention_args *a) {
  if (a->deterministic) return true;
  const char *env = std::getenv("LUTRA_CUDNN_DETERMINISTIC");
  return !(env && std::strcmp(env, "0") == 0);
}

const char *dtype_name(int32_t dtype) {
  return dtype == LUTRA_BF16 ? "bf16" : dtype == LUTRA_F16 ? "f16" : "f32";
}

/* What cuDNN's fused attention cannot take, refused before any graph is built, so that the
 * common mistakes get lutra's words rather than a heuristics failure. */
int check_args(const lutra_attention_args *a, const char *fn) {
  CHECK_ARG(a != nullptr, "arguments are NULL");
  if (a->dtype == LUTRA_F32)
    return lutra_error(LUTRA_EUNSUPPORTED, fn,
                       "cuDNN's fused attention runs bf16 or f16, not f32 (the cpu runs f32)");
  CHECK_ARG(a->dtype == LUTRA_BF16 || a->dtype == LUTRA_F16, "dtype %d is not bf16 or f16",
            (int)a->dtype);
  CHECK_ARG(a->b > 0 && a->s_q > 0 && a->s_kv > 0 && a->h > 0 && a->h_kv > 0 && a->d > 0,
            "shape b %lld, s_q %lld, s_kv %lld, h %lld, h_kv %lld, d %lld has a size below 1",
            (long long)a->b, (long long)a->s_q, (long long)a->s_kv, (long long)a->h,
            (long long)a->h_kv, (long long)a->d);
  if (a->d % 8 != 0 || a->d > 256)
    return lutra_error(LUTRA_EUNSUPPORTED, fn,
                       "head_dim %lld: cuDNN's fused attention takes a multiple of 8 up to 256",
                       (long long)a->d);
  CHECK_ARG(a->h % a->h_kv == 0, "%lld query heads are not a multiple of %lld key/value heads",
            (long long)a->h, (long long)a->h_kv);
  CHECK_ARG(!a->causal || a->s_q == a->s_kv, "causal attention needs s_q (%lld) == s_kv (%lld)",
            (long long)a->s_q, (long long)a->s_kv);
  CHECK_ARG(a->dropout >= 0 && a->dropout < 1, "dropout %g is not in [0, 1)", (double)a->dropout);
  CHECK_ARG(a->q_stride[3] == 1 && a->k_stride[3] == 1 && a->v_stride[3] == 1 &&
                a->o_stride[3] == 1,
            "head_dim must be contiguous (stride 1) in q, k, v and out");
  return LUTRA_OK;
}

int build_plan(const lutra_attention_args *a, void **out, size_t *workspace_bytes,
               int *deterministic, const char *fn) {
  TRY(check_args(a, fn));
  CHECK_ARG(out && workspace_bytes && deterministic, "plan outputs are NULL");
  TRY(lutra_cuda_refuse_in_capture(fn, "building cuDNN's attention graphs (a new shape)"));
  TRY(open_cudnn(fn));
  cudnnHandle_t h;
  TRY(handle_for_stream(fn, &h));
  char shape[192];
  snprintf(shape, sizeof shape, "b %lld, s_q %lld, s_kv %lld, h %lld, h_kv %lld, d %lld, %s%s%s",
           (long long)a->b, (long long)a->s_q, (long long)a->s_kv, (long long)a->h,
           (long long)a->h_kv, (long long)a->d, a->fp8 ? "fp8" : dtype_name(a->dtype),
           a->causal ? ", causal" : "", a->dropout > 0 ? ", dropout" : "");

  std::unique_ptr<attention_plan> p(new attention_plan);
  if (a->fp8) TRY(fp8_check(a, fn));
  p->fp8 = a->fp8 != 0;
  p->fwd = p->fp8 ? fp8_forward_graph(a) : forward_graph(a);
  fe::error_t e = build(*p->fwd, h);
  if (e.is_bad())
    return lutra_error(LUTRA_EUNSUPPORTED, fn, "cuDNN cannot run this attention forward (%s): %s",
                       shape, e.err_msg.c_str());
  /* the deterministic backward where cuDNN has one for this shape and device, else the other
   * (FP8: cuDNN's default, unless the switch asks) unless the determinism switch is on */
  p->deterministic = a->deterministic || (!p->fp8 && want_deterministic(a));
  p->bwd = p->fp8 ? fp8_backward_graph(a) : backward_graph(a, p->deterministic);
  e = build(*p->bwd, h);
  if (e.is_bad() && p->deterministic && !a->deterministic) {
    p->deterministic = false;
    p->bwd = backward_graph(a, false);
    e = build(*p->bwd, h);
  }
  if (e.is_bad()) {
    p->bwd_error =
        std::string(a->deterministic ? "cuDNN has no deterministic attention backward ("
                                     : "cuDNN cannot run this attention backward (") +
        shape + ")" +
        (a->deterministic ? " and the determinism switch is on (lutra_set_deterministic)" : "") +
        ": " + e.err_msg;
    p->bwd.reset();
  }

  int64_t fwd_ws = 0, bwd_ws = 0;
  e = p->fwd->get_workspace_size(fwd_ws);
  if (e.is_good() && p->bwd) e = p->bwd->get_workspace_size(bwd_ws);
  if (e.is_bad())
    return lutra_error(LUTRA_EBACKEND, fn, "cuDNN's attention workspace size: %s",
                       e.err_msg.c_str());
  p->workspace = fwd_ws > bwd_ws ? fwd_ws : bwd_ws;

  p->fwd_pack.bind({Q, K, V, O, STATS});
  if (p->bwd) p->bwd_pack.bind({Q, K, V, O, STATS, DO, DQ, DK, DV});
  if (p->fp8) fp8_bind(*p);
  if (a->dropout > 0) {
    p->dropout = true;
    p->fwd_pack.bind({SEED, OFFSET});
    p->bwd_pack.bind({SEED, OFFSET});
  }
  *workspace_bytes = (size_t)p->workspace;
  *deterministic = p->deterministic;
  *out = p.release();
  return LUTRA_OK;
}

int check_call(const lutra_attention_args *a, const char *fn, attention_plan **p) {
  CHECK_ARG(a != nullptr, "arguments are NULL");
  CHECK_ARG(a->plan != nullptr, "no plan: attention_plan builds one for the shape");
  *p = static_cast<attention_plan *>(a->plan);
  CHECK_ARG(a->workspace != nullptr || (*p)->workspace == 0,
            "the plan needs a %lld-byte workspace and none was given", (long long)(*p)->workspace);
  CHECK_ARG(a->workspace_bytes >= (*p)->workspace, "workspace of %lld bytes, the plan needs %lld",
            (long long)a->workspace_bytes, (long long)(*p)->workspace);
  return LUTRA_OK;
}

/* Runs body, turning whatever it throws into a status naming fn. */
template <class Body> int guarded(const char *fn, Body &&body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc &) {
    return lutra_error(LUTRA_ENOMEM, fn, "out of host memory (cuDNN graphs)");
  } catch (const std::exception &e) {
    return lutra_error(LUTRA_EBACKEND, fn, "cudnn-frontend: %s", e.what());
  } catch (...) {
    return lutra_error(LUTRA_EBACKEND, fn, "cudnn-frontend threw an unknown exception");
  }
}

/* What a call bakes into cuDNN's kernels, the key of its cached graph: memcmp'd, so no padding */
struct call_key {
  const void *q, *k, *v, *out, *stats, *dout, *dq, *dk, *dv, *workspace;
  const float *fp8_state;
  const int64_t *rng;
  cudaStream_t stream;
};
static_assert(sizeof(call_key) == 13 * sizeof(void *), "call_key has padding bytes");

/* one execute of a graph with its pack: what call_graphs.c runs directly or captures (from C:
 * nothing may be thrown through it) */
struct call {
  fe::graph::Graph *graph;
  pack *k;
  cudnnHandle_t handle;
  void *workspace;
  const char *fn, *what;
};

int issue_call(void *ctx) {
  const call *c = static_cast<const call *>(ctx);
  return guarded(c->fn, [c]() -> int {
    fe::error_t e = c->graph->execute(c->handle, c->k->map, c->workspace);
    if (e.is_bad()) return lutra_error(LUTRA_EBACKEND, c->fn, "%s: %s", c->what, e.err_msg.c_str());
    return LUTRA_OK;
  });
}

int execute(lutra_call_graphs **cache, const call_key &key, call &c) {
  return lutra_call_graphs_run(cache, LUTRA_CALLS_GEMM, &key, sizeof key, key.stream, issue_call,
                               &c, c.fn);
}

/* What both directions do first: the plan, its workspace and the pointers checked, the handle
 * set to lutra's stream, the inputs and dropout's device (seed, offset) in the pack. */
int begin_call(const lutra_attention_args *a, bool backward, const char *fn, attention_plan **p,
               cudnnHandle_t *h) {
  TRY(check_call(a, fn, p));
  if (backward && !(*p)->bwd)
    return lutra_error(LUTRA_EUNSUPPORTED, fn, "%s", (*p)->bwd_error.c_str());
  CHECK_ARG(a->q && a->k && a->v && a->out && a->stats, "q, k, v, out and stats must be set");
  CHECK_ARG(!backward || (a->dout && a->dq && a->dk && a->dv),
            "the backward's dout, dq, dk and dv must be set");
  CHECK_ARG((a->fp8 != 0) == (*p)->fp8, "the plan was built %s FP8, the call is %s",
            (*p)->fp8 ? "for" : "without", a->fp8 ? "FP8" : "not");
  CHECK_ARG(!a->fp8 || a->fp8_state, "an FP8 call without fp8_state");
  CHECK_ARG(!(*p)->dropout || a->rng,
            "dropout without rng: cuDNN reads the (seed, offset) from device memory");
  TRY(handle_for_stream(fn, h));
  pack &k = backward ? (*p)->bwd_pack : (*p)->fwd_pack;
  if ((*p)->dropout) {
    k.set(SEED, a->rng);
    k.set(OFFSET, a->rng + 1);
  }
  k.set(Q, a->q);
  k.set(K, a->k);
  k.set(V, a->v);
  k.set(O, a->out);
  k.set(STATS, a->stats);
  if (a->fp8) fp8_set(k, a->fp8_state, backward);
  return LUTRA_OK;
}

/* dropout's device offset (a->rng[1]) += step on lutra's stream (kernels/attention/) */
int advance_offset(const lutra_attention_args *a, uint64_t step, const char *fn) {
  return lutra_cuda_status(lk_attention_offset_advance(a->rng + 1, step, lutra_cuda_stream()), fn,
                           "advancing dropout's offset");
}

int run_forward(const lutra_attention_args *a, const char *fn) {
  attention_plan *p;
  cudnnHandle_t h;
  TRY(begin_call(a, false, fn, &p, &h));
  const call_key key = {
      a->q,    a->k,         a->v,         a->out, a->stats,           nullptr, nullptr, nullptr,
      nullptr, a->workspace, a->fp8_state, a->rng, lutra_cuda_stream()};
  call c = {p->fwd.get(), &p->fwd_pack, h, a->workspace, fn, "cuDNN's SDPA forward"};
  /* this forward's mask: the offset advanced on the stream, captured with the SDPA call (and
   * moved back when the call fails: a refused call changes nothing) */
  if (p->dropout) TRY(advance_offset(a, LUTRA_ATTENTION_OFFSET_STEP, fn));
  int st = execute(&p->fwd_calls, key, c);
  if (st != LUTRA_OK && p->dropout)
    (void)advance_offset(a, 0 - (uint64_t)LUTRA_ATTENTION_OFFSET_STEP, fn);
  return st;
}

int run_backward(const lutra_attention_args *a, const char *fn) {
  attention_plan *p;
  cudnnHandle_t h;
  TRY(begin_call(a, true, fn, &p, &h));
  pack &k = p->bwd_pack;
  k.set(DO, a->dout);
  k.set(DQ, a->dq);
  k.set(DK, a->dk);
  k.set(DV, a->dv);
  const call_key key = {
      a->q,  a->k,         a->v,         a->out, a->stats,           a->dout, a->dq, a->dk,
      a->dv, a->workspace, a->fp8_state, a->rng, lutra_cuda_stream()};
  call c = {p->bwd.get(), &k, h, a->workspace, fn, "cuDNN's SDPA backward"};
  return execute(&p->bwd_calls, key, c);
}

} // namespace

/* ---- the C interface (cuda_backend.h) ------------------------------------------------------ */

extern "C" int lutra_cuda_attention_plan(const lutra_attention_args *a, void **plan,
                                         size_t *workspace_bytes, int *deterministic) {
  static const char fn[] = "lutra_cuda_attention_plan";
  return guarded(fn, [&] { return build_plan(a, plan, workspace_bytes, deterministic, fn); });
}

extern "C" void lutra_cuda_attention_plan_free(void *plan) {
  if (!plan) return;
  (void)guarded("lutra_cuda_attention_plan_free", [&] {
    delete static_cast<attention_plan *>(plan);
    return LUTRA_OK;
  });
}

extern "C" int lutra_cuda_attention_forward(const lutra_attention_args *a) {
  static const char fn[] = "lutra_cuda_attention_forward";
  return guarded(fn, [&] { return run_forward(a, fn); });
}

extern "C" int lutra_cuda_attention_backward(const lutra_attention_args *a) {
  static const char fn[] = "lutra_cuda_attention_backward";
  return guarded(fn, [&] { return run_backward(a, fn); });
}

// cuDNN fused attention (see flash_attention_cudnn.hpp for what and why).
//
// One cuDNN frontend graph per (dtype, batch, seq, d, heads, direction):
//   forward   Q, K, V [B, H, T, hd] strided views of qkv (row stride 3d, head
//             stride hd) -> O [B, H, T, hd] strided into ctx (row stride d),
//             Stats [B, H, T, 1] f32 = our lse layout ((b*H + h)*T + i).
//   backward  Q, K, V, O, dO (strided as above), Stats -> dQ, dK, dV strided
//             into dqkv exactly as q, k, v sit in qkv.
// Causal mask aligned top-left (query i sees keys j <= i), scale 1/sqrt(hd),
// f32 softmax statistics and accumulation (intermediate and compute type f32).
// Only compiled when CMake found the frontend (KSHARD_HAVE_CUDNN), by the host
// compiler (engine/CMakeLists.txt).
#if defined(KSHARD_HAVE_CUDNN)

#include "flash_attention_cudnn.hpp"
#include "sanitizer_marks.hpp"

#include <cudnn.h>
#include <cudnn_frontend.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "kshard/error.hpp"

namespace kshard::detail {
namespace {

namespace fe = cudnn_frontend;

// Tensor uids of the variant pack.
enum Uid : std::int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

using Key = std::tuple<int, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t>;

struct Shape {
  std::int64_t batch, seq, d, heads;
  std::int64_t head_dim() const { return d / heads; }
};

struct Entry {
  std::shared_ptr<fe::graph::Graph> graph;  // null: cuDNN declined this shape
  std::int64_t workspace_bytes = 0;
};

struct State {
  std::mutex mutex;
  cudnnHandle_t handle = nullptr;
  std::map<Key, Entry> graphs;
  std::string last_decline;

  void release() {
    graphs.clear();
    if (handle) cudnnDestroy(handle);
    handle = nullptr;
  }
};

State& state() {
  static State s;
  return s;
}

// Created on first use, destroyed by cudnn_attention_release (Kokkos::finalize)
// while the CUDA context still exists. False (with the reason in
// last_decline) when cuDNN cannot be initialised.
bool ensure_handle(State& s) {
  if (s.handle) return true;
  // The frontend is compiled against these headers' enums and descriptor
  // attributes; cuDNN promises compatibility with NEWER libraries of the same
  // major version, not older ones. Decline instead: kshard's kernel runs.
  // ci/cudnn-frontend supplies the oldest cuDNN 9 headers for CUDA 13 (9.12)
  // so that this holds for every such runtime (the H200 image's system
  // library is 9.14; the CUDA toolkit's own headers are 9.19).
  const std::size_t runtime = cudnnGetVersion();
  if (runtime < static_cast<std::size_t>(CUDNN_VERSION)) {
    s.last_decline = "libcudnn " + std::to_string(runtime) + " is older than the cuDNN " +
                     std::to_string(CUDNN_VERSION) +
                     " headers kshard was built with (put a newer libcudnn.so.9 first on "
                     "LD_LIBRARY_PATH, or build against the older headers)";
    return false;
  }
  const cudnnStatus_t st = cudnnCreate(&s.handle);
  if (st != CUDNN_STATUS_SUCCESS) {
    s.handle = nullptr;
    s.last_decline = std::string("cudnnCreate: ") + cudnnGetErrorString(st);
    return false;
  }
  return true;
}

// Says once per process on stderr that (and why) cuDNN declined: the run goes
// on with kshard's own kernel, only slower, which a user should know.
void note_decline(State& s) {
  static bool said = false;
  if (said) return;
  said = true;
  std::fprintf(stderr, "kshard: cuDNN fused attention declined (%s); using kshard's kernel\n",
               s.last_decline.c_str());
}

Key key_of(const CudnnAttentionArgs& a, bool backward) {
  return Key{a.f16 ? 1 : 0, backward, a.batch, a.seq, a.d, a.heads};
}

// [B, H, T, hd] over a row-major [B*T, row] matrix whose head h starts at
// column h*hd.
std::shared_ptr<fe::graph::Tensor_attributes> bhtd(fe::graph::Graph& g, const char* name,
                                                   Uid uid, const Shape& shape,
                                                   std::int64_t row) {
  const std::int64_t hd = shape.head_dim();
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({shape.batch, shape.heads, shape.seq, hd})
                      .set_stride({shape.seq * row, hd, row, 1}));
}

void set_bhtd(fe::graph::Tensor_attributes& t, const char* name, Uid uid,
              const Shape& shape, std::int64_t row) {
  const std::int64_t hd = shape.head_dim();
  t.set_name(name)
      .set_uid(uid)
      .set_output(true)
      .set_dim({shape.batch, shape.heads, shape.seq, hd})
      .set_stride({shape.seq * row, hd, row, 1});
}

std::shared_ptr<fe::graph::Tensor_attributes> stats_tensor(fe::graph::Graph& g,
                                                           const Shape& shape) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name("stats")
                      .set_uid(kStats)
                      .set_data_type(fe::DataType_t::FLOAT)
                      .set_dim({shape.batch, shape.heads, shape.seq, 1})
                      .set_stride({shape.heads * shape.seq, shape.seq, 1, 1}));
}

// Builds the graph; returns an empty message on success, else why not.
std::string build(fe::graph::Graph& g, cudnnHandle_t h) {
  auto fail = [](const char* step, fe::error_t e) {
    return std::string(step) + ": " + e.get_message();
  };
  if (auto e = g.validate(); e.is_bad()) return fail("validate", e);
  if (auto e = g.build_operation_graph(h); e.is_bad()) return fail("build_operation_graph", e);
  if (auto e = g.create_execution_plans({fe::HeurMode_t::A}); e.is_bad())
    return fail("create_execution_plans", e);
  if (auto e = g.check_support(h); e.is_bad()) return fail("check_support", e);
  if (auto e = g.build_plans(h, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE); e.is_bad())
    return fail("build_plans", e);
  return {};
}

std::shared_ptr<fe::graph::Graph> make_graph(const CudnnAttentionArgs& a, bool backward) {
  const Shape shape{a.batch, a.seq, a.d, a.heads};
  const std::int64_t d = a.d, hd = shape.head_dim();
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(a.f16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto q = bhtd(*g, "q", kQ, shape, 3 * d);
  auto k = bhtd(*g, "k", kK, shape, 3 * d);
  auto v = bhtd(*g, "v", kV, shape, 3 * d);
  if (!backward) {
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("kshard_attention_forward")
                    .set_generate_stats(true)
                    .set_causal_mask(true)
                    .set_attn_scale(scale);
    const auto out = g->sdpa(q, k, v, opts);
    set_bhtd(*out[0], "o", kO, shape, d);
    const std::vector<std::int64_t> dim{a.batch, a.heads, a.seq, 1};
    const std::vector<std::int64_t> stride{a.heads * a.seq, a.seq, 1, 1};
    out[1]->set_name("stats").set_uid(kStats).set_output(true);
    out[1]->set_data_type(fe::DataType_t::FLOAT).set_dim(dim).set_stride(stride);
  } else {
    auto o = bhtd(*g, "o", kO, shape, d);
    auto dout = bhtd(*g, "do", kDO, shape, d);
    auto stats = stats_tensor(*g, shape);
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("kshard_attention_backward")
                    .set_causal_mask(true)
                    .set_attn_scale(scale)
                    .set_deterministic_algorithm(true);
    const auto grads = g->sdpa_backward(q, k, v, o, dout, stats, opts);
    set_bhtd(*grads[0], "dq", kDQ, shape, 3 * d);
    set_bhtd(*grads[1], "dk", kDK, shape, 3 * d);
    set_bhtd(*grads[2], "dv", kDV, shape, 3 * d);
  }
  return g;
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

bool shape_fits(const CudnnAttentionArgs& a) {
  if (a.heads <= 0 || a.d % a.heads != 0) return false;
  const std::int64_t hd = a.d / a.heads;
  // 16-byte aligned operands: hd and d multiples of 8 elements keep every
  // row and head start aligned when the base pointers are.
  if (hd % 8 != 0 || hd > 128 || a.d % 8 != 0) return false;
  for (const void* p : {static_cast<const void*>(a.qkv), static_cast<const void*>(a.ctx),
                        static_cast<const void*>(a.dctx), static_cast<const void*>(a.out)})
    if (p != nullptr && !aligned16(p)) return false;
  return true;
}

// The cached entry for this shape, built on first use.
Entry& entry(State& s, const CudnnAttentionArgs& a, bool backward) {
  const Key key = key_of(a, backward);
  auto it = s.graphs.find(key);
  if (it != s.graphs.end()) return it->second;
  Entry e;
  std::string why;
  try {
    if (!ensure_handle(s)) {
      note_decline(s);
      return s.graphs.emplace(key, std::move(e)).first->second;
    }
    auto g = make_graph(a, backward);
    why = build(*g, s.handle);
    if (why.empty()) {
      std::int64_t bytes = 0;
      if (auto err = g->get_workspace_size(bytes); err.is_bad())
        why = "get_workspace_size: " + err.get_message();
      e.workspace_bytes = bytes;
      if (why.empty()) e.graph = std::move(g);
    }
  } catch (const std::exception& ex) {
    why = ex.what();
  }
  if (!e.graph) {
    s.last_decline = std::string(backward ? "backward" : "forward") + " batch " +
                     std::to_string(a.batch) + " seq " + std::to_string(a.seq) + " d " +
                     std::to_string(a.d) + " heads " + std::to_string(a.heads) + ": " + why;
    note_decline(s);
  }
  return s.graphs.emplace(key, std::move(e)).first->second;
}

}  // namespace

bool cudnn_attention_serves(const CudnnAttentionArgs& a, bool backward,
                            std::int64_t* workspace_bytes) {
  if (!shape_fits(a)) return false;
  State& s = state();
  std::lock_guard<std::mutex> l(s.mutex);
  const Entry& e = entry(s, a, backward);
  if (workspace_bytes) *workspace_bytes = e.workspace_bytes;
  return e.graph != nullptr;
}

void cudnn_attention_run(const CudnnAttentionArgs& a, bool backward, cudaStream_t stream,
                         void* workspace) {
  State& s = state();
  std::lock_guard<std::mutex> l(s.mutex);
  const Entry& e = entry(s, a, backward);
  const char* who = backward ? "kshard::flash_attention_backward" : "kshard::flash_attention_forward";
  if (!e.graph) throw Error(std::string(who) + ": cuDNN declined this shape", "a shape cuDNN serves");
  const std::int64_t esize = 2;  // bytes per bf16 / f16 element
  auto at = [&](const void* base, std::int64_t elems) {
    return static_cast<void*>(const_cast<char*>(static_cast<const char*>(base)) + elems * esize);
  };
  std::unordered_map<std::int64_t, void*> pack;
  pack[kQ] = at(a.qkv, 0);
  pack[kK] = at(a.qkv, a.d);
  pack[kV] = at(a.qkv, 2 * a.d);
  if (!backward) {
    pack[kO] = a.out;
    pack[kStats] = a.lse;
  } else {
    pack[kO] = const_cast<void*>(a.ctx);
    pack[kDO] = const_cast<void*>(a.dctx);
    pack[kStats] = const_cast<float*>(a.lse_in);
    pack[kDQ] = at(a.out, 0);
    pack[kDK] = at(a.out, a.d);
    pack[kDV] = at(a.out, 2 * a.d);
  }
  const cudnnStatus_t st = cudnnSetStream(s.handle, stream);
  if (st != CUDNN_STATUS_SUCCESS)
    throw Error(std::string("cudnnSetStream: ") + cudnnGetErrorString(st), "a valid CUDA stream");
  if (auto err = e.graph->execute(s.handle, pack, e.workspace_bytes > 0 ? workspace : nullptr);
      err.is_bad())
    throw Error(std::string(who) + ": cuDNN execute failed: " + err.get_message(),
                "the graph that built for this shape to run");
  // What the graph wrote (sanitizer_marks.hpp): forward O [B*T, d] and the
  // statistics [B, H, T]; backward dQ, dK, dV, which fill dqkv [B*T, 3d].
  const std::size_t rows = std::size_t(a.batch * a.seq);
  if (!backward) {
    mark_written(stream, a.out, rows * std::size_t(a.d) * esize);
    mark_written(stream, a.lse, rows * std::size_t(a.heads) * sizeof(float));
  } else {
    mark_written(stream, a.out, rows * std::size_t(3 * a.d) * esize);
  }
}

void cudnn_attention_release() {
  State& s = state();
  std::lock_guard<std::mutex> l(s.mutex);
  s.release();
}

}  // namespace kshard::detail

#endif  // KSHARD_HAVE_CUDNN

#pragma once
// Shared by the checkpoint suites: the launch's mesh and data directory (from
// the environment CTest sets), a small GPT-style model trained with FusedAdam
// the way examples/train/train.cpp drives it, and the full (all-gathered)
// training state for bitwise comparisons across meshes.
//
// Environment: KSHARD_CKPT_ROOT  data directory of this build (CTest sets it)
//              KSHARD_CKPT_MESH  this launch's mesh: "2", "4", "2x2", "1"
//              KSHARD_CKPT_FROM  (reshard launches) the mesh whose saves to load
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <Kokkos_Core.hpp>
#include <nlohmann/json.hpp>

#include <kshard_test/gathers.hpp>
#include "kshard/checkpoint/checkpoint.hpp"
#include "kshard/engine/nn/embedding.hpp"
#include "kshard/engine/fsdp/fsdp_model.hpp"
#include "kshard/engine/nn/layer_norm.hpp"
#include "kshard/engine/nn/linear.hpp"
#include "kshard/optim/loss_scaler.hpp"
#include "kshard/engine/nn/transformer_layer.hpp"
#include "kshard/mesh/agree.hpp"
#include "kshard/mesh/device_mesh.hpp"
#include "kshard/numeric/convert.hpp"
#include "kshard/optim/fused_adam.hpp"

namespace ckpt_test {

namespace fs = std::filesystem;

inline std::string env(const char* name, const char* fallback = "") {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

/// The data directory shared by the launches of this build.
inline fs::path root() {
  const std::string r = env("KSHARD_CKPT_ROOT");
  return r.empty() ? fs::temp_directory_path() / "kshard-ckpt-test" : fs::path(r);
}

/// "2x2" -> {2, 2}; "" -> {world size}.
inline std::vector<int> parse_mesh(const std::string& s, int world_size) {
  if (s.empty()) return {world_size};
  std::vector<int> out;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, 'x')) out.push_back(std::stoi(part));
  return out;
}

inline std::string mesh_name(const std::vector<int>& m) {
  std::string s;
  for (std::size_t i = 0; i < m.size(); ++i) s += (i ? "x" : "") + std::to_string(m[i]);
  return s;
}

inline kshard::DeviceMesh make_mesh(const kshard::Communicator& world, const std::vector<int>& shape) {
  return shape.size() == 2 ? kshard::DeviceMesh(world, shape, {"replicate", "shard"})
                           : kshard::DeviceMesh(world, shape, {"shard"});
}

/// This launch's mesh from KSHARD_CKPT_MESH, or the world's 1-D mesh when
/// that mesh does not fit the launch: ci/threaded-suites runs each suite
/// once at 1 rank with its first registration's environment (MESH=2).
inline std::vector<int> launch_mesh(int world_size) {
  const std::vector<int> m = parse_mesh(env("KSHARD_CKPT_MESH"), world_size);
  long long ranks = 1;
  for (int d : m) ranks *= d;
  return ranks == world_size ? m : std::vector<int>{world_size};
}

/// This launch's directory for `what` under the data root:
/// <root>/mesh-<launch mesh>/<what>.
inline fs::path launch_dir(int world_size, const fs::path& what) {
  return root() / ("mesh-" + mesh_name(launch_mesh(world_size))) / what;
}

/// Rank 0 makes an empty directory; every rank waits for it.
inline void fresh_dir(const fs::path& p, const kshard::Communicator& comm) {
  if (comm.rank() == 0) {
    fs::remove_all(p);
    fs::create_directories(p);
  }
  comm.barrier();
}

struct ModelCfg {
  int vocab = 64, d = 32, heads = 2, seq = 8;
  int global_batch = 8;  // sequences per step over the whole world
};

inline std::vector<kshard::LayerDef> layers(const ModelCfg& c) {
  return {kshard::layer<kshard::Embedding>(std::int64_t(c.vocab), std::int64_t(c.d), std::int64_t(c.seq)),
          kshard::layer<kshard::TransformerLayer>(std::int64_t(c.d), std::int64_t(c.heads),
                                                  std::int64_t(4 * c.d)),
          kshard::layer<kshard::LayerNorm>(std::int64_t(c.d)),
          kshard::layer<kshard::Linear>(std::int64_t(c.d), std::int64_t(c.vocab))};
}

/// "fp8+init" -> fp8 with fp8_init.
inline kshard::Recipe recipe_of(const std::string& name) {
  if (name == "fp8+init") return kshard::Recipe::parse("fp8", true);
  return kshard::Recipe::parse(name);
}

inline const std::vector<std::string>& all_recipes() {
  static const std::vector<std::string> r{"fp32", "bf16", "fp16", "fp8", "fp8+init"};
  return r;
}

/// bf16 moments under the bf16 recipe (so both moment dtypes are covered).
inline kshard::DType moments_of(const std::string& recipe) {
  return recipe == "bf16" ? kshard::DType::bf16 : kshard::DType::f32;
}

/// Model + FusedAdam + loss scaler, stepped as kshard-train steps them.
struct Trainer {
  kshard::DeviceMesh mesh;
  ModelCfg cfg;
  std::unique_ptr<kshard::FsdpModel> model;
  std::unique_ptr<kshard::FusedAdam> opt;
  kshard::DynamicLossScaler scaler;
  std::int64_t step = 0;  // data position: next step to run
  Kokkos::View<std::int32_t*> ids, targets;

  Trainer(const kshard::DeviceMesh& m, const std::string& recipe, std::uint64_t seed,
          ModelCfg c = {}, kshard::FsdpOptions fo = {})
      : mesh(m), cfg(c) {
    model = std::make_unique<kshard::FsdpModel>(mesh, layers(cfg), recipe_of(recipe), fo);
    model->init_parameters(seed);
    kshard::AdamOptions ao;
    ao.lr = 1e-2f;
    ao.weight_decay = 0.01f;
    ao.moment_dtype = moments_of(recipe);
    opt = std::make_unique<kshard::FusedAdam>(ao, mesh.shard_comm(), mesh.world());
    for (std::size_t i = 0; i < model->num_units(); ++i) opt->add_group(model->group(i));
    const int rows = rows_per_rank();
    ids = Kokkos::View<std::int32_t*>("ckpt_test.ids", std::size_t(rows));
    targets = Kokkos::View<std::int32_t*>("ckpt_test.targets", std::size_t(rows));
  }

  int batch_per_rank() const { return cfg.global_batch / mesh.world().size(); }
  int rows_per_rank() const { return batch_per_rank() * cfg.seq; }

  /// One step on this rank's slice of global batch `step`; returns the local loss.
  double train_step() {
    const int b = batch_per_rank(), rank = mesh.world().rank();
    auto ih = Kokkos::create_mirror_view(ids);
    auto th = Kokkos::create_mirror_view(targets);
    for (int s = 0; s < b; ++s) {
      const std::uint64_t seq = std::uint64_t(step) * cfg.global_batch + std::uint64_t(rank * b + s);
      for (int t = 0; t < cfg.seq; ++t) {
        std::uint64_t x = seq * 1000003ull + std::uint64_t(t) * 7919ull + 12345ull;
        x ^= x >> 29;
        x *= 0xbf58476d1ce4e5b9ull;
        x ^= x >> 32;
        const int id = int(x % std::uint64_t(cfg.vocab));
        ih(std::size_t(s * cfg.seq + t)) = id;
        th(std::size_t(s * cfg.seq + t)) = (id * 5 + 3) % cfg.vocab;
      }
    }
    Kokkos::deep_copy(ids, ih);
    Kokkos::deep_copy(targets, th);
    const bool scaling = model->recipe().loss_scaling;
    const float scale = scaling ? scaler.scale() : 1.f;
    model->zero_grad();
    const double loss = model->forward_backward_ce(ids, {b, cfg.seq, 1}, targets, double(scale));
    const kshard::GradShardStats local = model->prepare_optimizer_step().grads;
    const kshard::StepResult r =
        opt->apply(opt->combine_stats(local.sum_squares, local.nonfinite > 0, scale), scale, 1.0);
    if (scaling) scaler.update(r.found_nonfinite);
    model->finish_optimizer_step();
    ++step;
    return loss;
  }

  /// Mean of the local losses over the world (equal rows per rank: the global mean).
  double global_loss(double local) const {
    std::vector<double> mean = {local};
    kshard::host_all_reduce(mesh.world(), mean, kshard::ReduceOp::avg);
    return mean[0];
  }

  /// The trainer's scalar state: what a kshard::Trainer would hand to save().
  nlohmann::json user_state() const {
    return {{"data_step", step}, {"loss_scale", scaler.scale()}, {"good_steps", scaler.good_steps()},
            {"rng", {{"seed", 1234}, {"offset", step * 17}}}};
  }
  void restore(const nlohmann::json& s) {
    step = s.at("data_step").get<std::int64_t>();
    scaler = kshard::DynamicLossScaler(s.at("loss_scale").get<float>());
    // DynamicLossScaler has no setter for its run of good steps: replay them
    // (fewer than growth_interval, so the scale does not change).
    for (int k = 0; k < s.at("good_steps").get<int>(); ++k) scaler.update(false);
  }
};

/// Every unit's master, exp_avg and exp_avg_sq, all-gathered (padding dropped;
/// the alignment gaps between parameters are zeros whatever the mesh).
struct FullState {
  std::vector<std::vector<float>> master, m, v;
  std::int64_t step = 0;
};

inline std::vector<float> gather_moment(const kshard::DeviceMesh& mesh, const kshard::AdamGroupState& st,
                                        bool second, std::size_t keep) {
  const kshard::Communicator& c = mesh.shard_comm();
  std::vector<float> out;
  if (st.moment_dtype == kshard::DType::bf16) {
    auto shard = second ? st.exp_avg_sq_bf16 : st.exp_avg_bf16;
    Kokkos::View<kshard::bfloat16_t*> full("ckpt_test.full", shard.size() * std::size_t(c.size()));
    c.all_gather(shard, full);
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), full);
    for (std::size_t i = 0; i < keep; ++i) out.push_back(kshard::to_float(h(i)));
  } else {
    auto shard = second ? st.exp_avg_sq : st.exp_avg;
    Kokkos::View<float*> full("ckpt_test.full", shard.size() * std::size_t(c.size()));
    c.all_gather(shard, full);
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), full);
    out.assign(h.data(), h.data() + keep);
  }
  return out;
}

inline FullState full_state(Trainer& t) {
  FullState s;
  s.master = kshard::test::gather_master_parameters(*t.model);
  for (std::size_t u = 0; u < s.master.size(); ++u) {
    s.m.push_back(gather_moment(t.mesh, t.opt->state(int(u)), false, s.master[u].size()));
    s.v.push_back(gather_moment(t.mesh, t.opt->state(int(u)), true, s.master[u].size()));
  }
  s.step = t.opt->step_count();
  return s;
}

inline bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b,
                      std::string& why, const char* what) {
  if (a.size() != b.size()) {
    why = std::string(what) + ": unit counts differ";
    return false;
  }
  for (std::size_t u = 0; u < a.size(); ++u) {
    if (a[u].size() != b[u].size()) {
      why = std::string(what) + ": unit " + std::to_string(u) + " sizes differ";
      return false;
    }
    for (std::size_t i = 0; i < a[u].size(); ++i)
      if (std::memcmp(&a[u][i], &b[u][i], 4) != 0) {
        std::ostringstream s;
        s << what << ": unit " << u << " element " << i << ": " << a[u][i] << " vs " << b[u][i];
        why = s.str();
        return false;
      }
  }
  return true;
}

inline bool same_state(const FullState& a, const FullState& b, std::string& why) {
  if (a.step != b.step) {
    why = "step counts " + std::to_string(a.step) + " vs " + std::to_string(b.step);
    return false;
  }
  return same_bits(a.master, b.master, why, "master") && same_bits(a.m, b.m, why, "exp_avg") &&
         same_bits(a.v, b.v, why, "exp_avg_sq");
}

/// Raw dump of a FullState (rank 0 writes it; any rank reads it).
inline void write_state(const fs::path& p, const FullState& s) {
  std::ofstream f(p, std::ios::binary);
  auto put = [&](std::int64_t x) { f.write(reinterpret_cast<const char*>(&x), 8); };
  put(std::int64_t(s.master.size()));
  for (std::size_t u = 0; u < s.master.size(); ++u) {
    put(std::int64_t(s.master[u].size()));
    for (const auto* v : {&s.master[u], &s.m[u], &s.v[u]})
      f.write(reinterpret_cast<const char*>(v->data()), std::streamsize(v->size() * 4));
  }
  put(s.step);
}

inline FullState read_state(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  auto get = [&] {
    std::int64_t x = 0;
    f.read(reinterpret_cast<char*>(&x), 8);
    return x;
  };
  FullState s;
  const std::int64_t n = get();
  for (std::int64_t u = 0; u < n; ++u) {
    const std::size_t k = std::size_t(get());
    for (auto* v : {&s.master, &s.m, &s.v}) {
      v->emplace_back(k);
      f.read(reinterpret_cast<char*>(v->back().data()), std::streamsize(k * 4));
    }
  }
  s.step = get();
  if (!f) throw std::runtime_error("cannot read " + p.string());
  return s;
}

/// Runs f, which must throw kshard::Error; returns its what() ("" if not).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const kshard::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("NOT a kshard::Error: ") + e.what();
  }
  return "";
}

}  // namespace ckpt_test

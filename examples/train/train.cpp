// kshard-train: the training demo. A small GPT-style model, every layer one
// FSDP unit, trained with FusedAdam on a built-in synthetic language.
//
//   mpiexec -n 2 kshard-train                       # 1-D mesh over both ranks, fp32
//   mpiexec -n 4 kshard-train --mesh 2x2 --recipe bf16 --accum 2
//
// Rank 0 prints one line per step (loss averaged over ranks, tokens/s, peak
// memory of the worst rank, whether the optimizer skipped the step) and a
// summary that compares the per-rank persistent memory with the ZeRO-3 bound.
// A bad command line ends every rank with the same message and exit code 2.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <Kokkos_Core.hpp>

#include "kshard/engine/attention.hpp"
#include "kshard/engine/embedding.hpp"
#include "kshard/engine/fsdp_model.hpp"
#include "kshard/engine/gemm.hpp"
#include "kshard/engine/layer_norm.hpp"
#include "kshard/engine/linear.hpp"
#include "kshard/engine/loss_scaler.hpp"
#include "kshard/engine/recipe.hpp"
#include "kshard/engine/transformer_layer.hpp"
#include "kshard/error.hpp"
#include "kshard/mesh/device_mesh.hpp"
#include "kshard/mesh/memory_tracker.hpp"
#include "kshard/mesh/session.hpp"
#include "kshard/optim/fused_adam.hpp"
#include "markov_task.hpp"
#include "train_options.hpp"

namespace {

using kshard_train::TrainOptions;
using Clock = std::chrono::steady_clock;

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

std::string shape_text(const std::vector<int>& s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

std::unique_ptr<kshard::FsdpModel> build_model(const kshard::DeviceMesh& mesh,
                                               const TrainOptions& o) {
  // Described once; the model builds the layers in the recipe's compute dtype.
  std::vector<kshard::LayerDef> layers;
  layers.push_back(kshard::layer<kshard::Embedding>(std::int64_t(o.vocab), std::int64_t(o.width),
                                                    std::int64_t(o.seq)));
  for (int l = 0; l < o.layers; ++l)
    layers.push_back(kshard::layer<kshard::TransformerLayer>(
        std::int64_t(o.width), std::int64_t(o.heads), std::int64_t(4 * o.width)));
  layers.push_back(kshard::layer<kshard::LayerNorm>(std::int64_t(o.width)));
  layers.push_back(kshard::layer<kshard::Linear>(std::int64_t(o.width), std::int64_t(o.vocab)));
  kshard::FsdpOptions fo;
  fo.reshard_after_forward = o.reshard_after_forward;
  fo.keep_low_precision_shard = o.keep_lp_shard;
  return std::make_unique<kshard::FsdpModel>(mesh, layers,
                                             kshard::Recipe::parse(o.recipe, o.fp8_init), fo);
}

/// Bytes of Adam's moments over all groups on this rank.
std::size_t optimizer_state_bytes(const kshard::FusedAdam& adam) {
  std::size_t b = 0;
  for (int g = 0; g < adam.num_groups(); ++g) {
    const auto& s = adam.state(g);
    b += (s.exp_avg.span() + s.exp_avg_sq.span()) * sizeof(float);
    b += (s.exp_avg_bf16.span() + s.exp_avg_sq_bf16.span()) * 2;
  }
  return b;
}

/// Small all_reduces of host numbers through a View of the default memory
/// space (which every backend accepts, NCCL included).
class Reducer {
 public:
  Reducer(const kshard::Communicator& comm, std::size_t n)
      : comm_(comm), dev_("kshard-train.reduce", n), host_(Kokkos::create_mirror_view(dev_)) {}
  std::vector<double> run(const std::vector<double>& v, kshard::ReduceOp op) {
    for (std::size_t i = 0; i < v.size(); ++i) host_(i) = v[i];
    Kokkos::deep_copy(dev_, host_);
    comm_.all_reduce(dev_, op);
    Kokkos::deep_copy(host_, dev_);
    std::vector<double> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = host_(i);
    return out;
  }

 private:
  kshard::Communicator comm_;
  Kokkos::View<double*> dev_;
  Kokkos::View<double*>::HostMirror host_;
};

int run(kshard::Session& session, int argc, char** argv) {
  const int rank = session.rank(), world_size = session.size();
  const kshard_train::ParsedOptions parsed = kshard_train::parse_options(argc, argv, world_size);
  if (parsed.help) {
    if (rank == 0) std::printf("%s", parsed.help_text.c_str());
    return 0;
  }
  const TrainOptions& o = parsed.options;
  const bool root = rank == 0;
  const kshard::Communicator& world = session.world();

  std::vector<std::string> names =
      o.mesh.size() == 2 ? std::vector<std::string>{"replicate", "shard"}
                         : std::vector<std::string>{"shard"};
  kshard::DeviceMesh mesh(world, o.mesh, names);
  const int shard_n = mesh.shard_size();

  kshard::set_allow_tf32(o.tf32);
  kshard::set_attention_impl(o.attention == "fused"       ? kshard::AttentionImpl::fused
                             : o.attention == "unfused"   ? kshard::AttentionImpl::unfused
                             : o.attention == "recompute" ? kshard::AttentionImpl::recompute
                                                          : kshard::AttentionImpl::automatic);
  auto model = build_model(mesh, o);
  model->init_parameters(o.seed);

  kshard::AdamOptions ao;
  ao.lr = float(o.lr);
  kshard::FusedAdam adam(ao, mesh.shard_comm(), mesh.world());
  for (std::size_t i = 0; i < model->num_units(); ++i) {
    kshard::ShardedGroup& g = model->group(i);
    const kshard::ModelParamRef ref = g.model_param();
    adam.add_group(g.master(), g.grad(),
                   ref.data ? kshard::ModelParamView::raw(ref.dtype, ref.data, ref.count)
                            : kshard::ModelParamView());
  }
  const bool loss_scaling = model->recipe().loss_scaling;
  kshard::DynamicLossScaler scaler;

  const kshard_train::MarkovTask task(o.vocab, o.seed);
  const std::int64_t rows = std::int64_t(o.batch) * o.seq;
  Kokkos::View<std::int32_t*> ids("kshard-train.ids", std::size_t(rows));
  Kokkos::View<std::int32_t*> targets("kshard-train.targets", std::size_t(rows));
  auto ids_h = Kokkos::create_mirror_view(ids);
  auto targets_h = Kokkos::create_mirror_view(targets);
  Reducer reducer(world, 4);

  const std::int64_t params = model->num_parameters();
  const double tokens_per_step = double(rows) * o.accum * world_size;
  if (root) {
    std::printf(
        "kshard-train: %d ranks, mesh %s, recipe %s%s, %d x TransformerLayer(d=%d, heads=%d, "
        "ff=%d), vocab %d, seq %d, batch %d/rank x %d micro-batches, %lld params, %s\n",
        world_size, kshard::DeviceMesh::describe(o.mesh, names).c_str(),
        model->recipe().describe().c_str(),
        o.reshard_after_forward ? "" : ", no reshard-after-forward", o.layers, o.width, o.heads,
        4 * o.width, o.vocab, o.seq, o.batch, o.accum, (long long)params,
        kshard::Session::current().default_backend() == kshard::Backend::nccl ? "nccl" : "mpi");
    std::printf("task: Markov chain, 2 successors per token (p 0.8/0.2): uniform guess %.3f "
                "nats, floor %.3f nats\n",
                std::log(double(o.vocab)), task.entropy_floor());
    std::fflush(stdout);
  }

  // Fault injection for the tests: this rank alone fails at the first step,
  // while the others go on into a collective (see all_ranks_failed).
  const char* inject = std::getenv("KSHARD_TRAIN_INJECT_ERROR");
  const bool inject_here = inject && std::atoi(inject) == rank;

  double first_loss = 0, last_loss = 0, tps_sum = 0, peak_max = 0, live_between = 0;
  int tps_count = 0, skipped_steps = 0;
  std::vector<double> tps_all;
  for (int step = 0; step < o.steps; ++step) {
    Kokkos::fence();
    live_between = std::max(live_between, double(kshard::memory::stats().live_bytes));
    kshard::memory::reset_peak();
    const auto t0 = Clock::now();
    const float scale = loss_scaling ? scaler.scale() : 1.f;
    model->zero_grad();
    if (inject_here)
      throw kshard::Error("injected failure (KSHARD_TRAIN_INJECT_ERROR) at step 1",
                          "no KSHARD_TRAIN_INJECT_ERROR in a real run");
    double loss = 0;
    for (int m = 0; m < o.accum; ++m) {
      // Global micro-batch (step, m) holds world_size * batch sequences; this
      // rank's slice starts at its world rank.
      const std::int64_t first =
          ((std::int64_t(step) * o.accum + m) * world_size + rank) * std::int64_t(o.batch);
      task.fill(first, o.batch, o.seq, ids_h.data(), targets_h.data());
      Kokkos::deep_copy(ids, ids_h);
      Kokkos::deep_copy(targets, targets_h);
      loss += model->forward_backward_ce(ids, {o.batch, o.seq, 1}, targets,
                                         double(scale) / o.accum, m == o.accum - 1);
    }
    loss /= o.accum;
    // The gradient statistics (global norm for clipping, inf/NaN for the
    // skip) were computed while the reduce-scatters were accumulated into the
    // shards: combine them across ranks and update, without a second read of
    // every gradient (FusedAdam::step() would do that pass itself).
    const kshard::GradShardStats local = model->local_grad_stats();
    const kshard::StepResult r = adam.apply(
        adam.combine_stats(local.sum_squares, local.nonfinite > 0, scale), scale, o.clip);
    if (loss_scaling) scaler.update(r.found_nonfinite);
    model->after_optimizer_step();
    Kokkos::fence();
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const double peak = double(kshard::memory::stats().peak_bytes);

    const double mean_loss = reducer.run({loss}, kshard::ReduceOp::avg)[0];
    const auto mx = reducer.run({seconds, peak}, kshard::ReduceOp::max);
    const double tps = tokens_per_step / mx[0];
    if (step == 0) first_loss = mean_loss;
    last_loss = mean_loss;
    // The first step pays for first-use allocations: leave it out of the mean.
    if (step > 0 || o.steps == 1) {
      tps_sum += tps;
      ++tps_count;
      tps_all.push_back(tps);
    }
    peak_max = std::max(peak_max, mx[1]);
    skipped_steps += r.skipped ? 1 : 0;
    if (root) {
      std::printf("step %4d/%d  loss %.4f  grad_norm %.3f  tokens/s %10.0f  peak/rank %s  %s",
                  step + 1, o.steps, mean_loss, r.grad_norm, tps, mib(mx[1]).c_str(),
                  r.skipped ? "SKIPPED (inf/nan gradient)" : "stepped");
      if (loss_scaling) std::printf("  loss_scale %g", double(scale));
      std::printf("\n");
      std::fflush(stdout);
    }
  }

  const double persistent = double(model->persistent_bytes());
  const double optimizer = double(optimizer_state_bytes(adam));
  const auto mem = reducer.run({persistent, optimizer, persistent + optimizer, live_between},
                               kshard::ReduceOp::max);
  const double unit = double(model->max_unit_bytes());
  const double sharded = 16.0 * double(params) / shard_n;
  const double bound = sharded + unit;
  const double tps_mean = tps_count ? tps_sum / tps_count : 0;
  std::sort(tps_all.begin(), tps_all.end());
  const double tps_median = tps_all.empty() ? 0 : tps_all[tps_all.size() / 2];
  if (root) {
    std::printf("summary: first_loss=%.4f last_loss=%.4f (uniform %.3f, floor %.3f) steps=%d "
                "skipped=%d\n",
                first_loss, last_loss, std::log(double(o.vocab)), task.entropy_floor(), o.steps,
                skipped_steps);
    std::printf("summary: tokens/s mean %.0f median %.0f (steps 2..%d, %.0f tokens per step over "
                "%d ranks)\n",
                tps_mean, tps_median, std::max(o.steps, 2), tokens_per_step, world_size);
    std::printf("summary: params=%lld  shard dimension %d  unit max %s unsharded\n",
                (long long)params, shard_n, mib(unit).c_str());
    std::printf("summary: persistent per rank %s (params+grads %s, optimizer %s) vs ZeRO-3 bound "
                "16 B x %lld / %d + one unit = %s: ratio %.3f (%.3f to 16 B/param/N alone)\n",
                mib(mem[2]).c_str(), mib(mem[0]).c_str(), mib(mem[1]).c_str(), (long long)params,
                shard_n, mib(bound).c_str(), mem[2] / bound, mem[2] / sharded);
    std::printf("summary: peak per rank %s (live between steps %s): ratio %.3f to the bound "
                "(activations and workspaces are outside it)\n",
                mib(peak_max).c_str(), mib(mem[3]).c_str(), peak_max / bound);
    if (o.bench) {
      std::ostringstream j;
      j.precision(10);
      j << "BENCH {\"ranks\": " << world_size << ", \"mesh\": \"" << shape_text(o.mesh)
        << "\", \"recipe\": \"" << model->recipe().describe() << "\", \"params\": " << params
        << ", \"shard_size\": " << shard_n << ", \"steps\": " << o.steps
        << ", \"tokens_per_step\": " << tokens_per_step << ", \"tokens_per_s\": " << tps_mean
        << ", \"tokens_per_s_median\": " << tps_median
        << ", \"persistent_bytes\": " << mem[0] << ", \"optimizer_bytes\": " << mem[1]
        << ", \"state_bytes\": " << mem[2] << ", \"peak_bytes\": " << peak_max
        << ", \"live_between_steps_bytes\": " << mem[3]
        << ", \"max_unit_bytes\": " << unit << ", \"bound_bytes\": " << bound
        << ", \"first_loss\": " << first_loss << ", \"last_loss\": " << last_loss << "}";
      std::printf("%s\n", j.str().c_str());
    }
    std::fflush(stdout);
  }
  return 0;
}

void report(int rank, const char* what) {
  std::fprintf(stderr, "[rank %d] kshard-train: error: %s\n", rank, what);
  std::fflush(stderr);
}

/// After an error: when every rank failed alike (a bad option, a collective
/// that rejected its arguments everywhere) they all get here and may leave
/// normally; when only some did, the others wait inside a collective that
/// will never complete, so abort the job instead of hanging. The barrier runs
/// on a private communicator so it cannot match a collective of the library.
bool all_ranks_failed(MPI_Comm comm, double timeout_s) {
  MPI_Request req;
  MPI_Ibarrier(comm, &req);
  const auto t0 = Clock::now();
  int done = 0;
  while (!done) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) break;
    if (std::chrono::duration<double>(Clock::now() - t0).count() > timeout_s) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::unique_ptr<kshard::Session> session;
  try {
    session = std::make_unique<kshard::Session>(argc, argv);
  } catch (const std::exception& e) {
    // E.g. an unknown KSHARD_BACKEND: the same on every rank, so every rank
    // gets here. Session undid nothing it had set up; leave tidily.
    report(kshard::error_rank(), e.what());
    if (Kokkos::is_initialized()) Kokkos::finalize();
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (inited && !finalized) MPI_Finalize();
    return 2;
  }
  const int rank = session->rank();
  MPI_Comm error_comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &error_comm);

  int rc = 0;
  try {
    rc = run(*session, argc, argv);
  } catch (const kshard_train::OptionError& e) {
    report(rank, e.what());
    rc = 2;
  } catch (const kshard::Error& e) {
    report(rank, e.what());
    rc = 2;
  } catch (const std::exception& e) {
    report(rank, e.what());
    rc = 1;
  }
  if (rc != 0 && !all_ranks_failed(error_comm, 10.0)) {
    report(rank, "not every rank failed; aborting the job so that no rank hangs");
    MPI_Abort(MPI_COMM_WORLD, rc);
  }
  MPI_Comm_free(&error_comm);
  session.reset();
  return rc;
}

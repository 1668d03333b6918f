#pragma once
// Trainer: the training loop of a language model, as one object. It owns the
// model (FsdpModel), the optimizer (FusedAdam, with every FSDP unit
// registered), the fp16 loss scaler, the LR schedule, the step counter and
// the data position; a step is one call. Its complete non-tensor state is a
// TrainerState (state() / restore()); the tensors are reached through
// model() and optimizer() — what checkpoints save and load.
//
// A whole training program (kshard-train is this plus options and output):
//
//   #include <kshard/mesh/session.hpp>
//   #include <kshard/train/train.hpp>
//   int main(int argc, char** argv) {
//     kshard::Session session(argc, argv);                       // MPI + Kokkos
//     kshard::DeviceMesh mesh(session.world(), {session.size()});
//     const std::int64_t vocab = 50304, d = 768, seq = 1024;
//     std::vector<kshard::LayerDef> defs{kshard::layer<kshard::Embedding>(vocab, d, seq)};
//     for (int l = 0; l < 12; ++l)
//       defs.push_back(kshard::layer<kshard::TransformerLayer>(d, std::int64_t(12), 4 * d));
//     defs.push_back(kshard::layer<kshard::LayerNorm>(d));
//     defs.push_back(kshard::layer<kshard::Linear>(d, vocab));
//     const kshard::Recipe recipe = kshard::Recipe::parse("bf16");
//     kshard::TrainerOptions o;
//     o.batch = 8; o.seq = seq; o.accum = 4; o.clip = 1.0; o.adam.weight_decay = 0.1f;
//     o.schedule = {kshard::LrScheduleKind::cosine, 6e-4, 6e-5, /*warmup=*/200, /*total=*/5000};
//     o.max_skipped = 20;
//     kshard::check_memory_fits(mesh.world(),
//         kshard::MemoryEstimate::of(defs, recipe, mesh.shard_size(), o.batch, o.seq));
//     kshard::FsdpModel model(mesh, defs, recipe);
//     model.init_parameters(/*seed=*/1);
//     kshard::Trainer trainer(std::move(model), o);
//     auto train = kshard::TokenFile::open(mesh.world(), "train.bin", kshard::TokenDType::u16, vocab, seq + 1);
//     auto val = kshard::TokenFile::open(mesh.world(), "val.bin", kshard::TokenDType::u16, vocab, seq + 1);
//     while (trainer.step_count() < o.schedule.total_steps) {
//       const kshard::StepReport r = trainer.step(train);        // throws TrainingDiverged
//       if (session.rank() == 0) std::printf("step %lld loss %.4f\n", (long long)r.step, r.loss);
//       if (r.step % 250 == 0) {
//         const double e = trainer.evaluate(val, /*batches=*/20).loss;
//         if (session.rank() == 0) std::printf("eval_loss %.4f\n", e);
//       }
//     }
//   }
//
// A step (collective over the mesh's world): every micro-batch's token ids
// are read on the host first (TokenSource::fill), and one tiny all_reduce
// makes a data error on any rank an error on every rank; then the LR of this
// step is set from the schedule, accum micro-batches run forward + backward
// (gradient scale = loss scale / accum; reduce-scatter on the last), the
// optimizer combines the gradient statistics the reduce-scatter computed
// (global norm, inf/NaN agreed by every rank) and steps or skips, the loss
// scaler is updated, and the loss is averaged over the world. With
// max_skipped > 0, that many skipped steps in a row throw TrainingDiverged on
// every rank (the skip decision is agreed, so they all count alike).
//
// Checkpoints (kshard::checkpoint, docs/CHECKPOINTS.md) hold the tensors —
// the f32 master shards, Adam's moments and step count — and, as their JSON
// user_state, the TrainerState (to_json, trainer_state_json.hpp):
//
//   trainer.save("run/ckpt");                       // run/ckpt/step-<step_count()>
//   if (auto info = trainer.resume("run/ckpt"))     // the newest one, if any
//     std::printf("resumed at step %lld\n", (long long)info->step);
//   trainer.load("run/ckpt/step-0000000100");       // that one
//
// save_async() (AsyncSaver, async_save.hpp) blocks only while the state is
// copied to host memory; a background thread writes this rank's file while
// training goes on, and the collective commit (manifest, rename to step-N)
// runs at the start of a later step(), once every rank's write has ended, or
// in wait_for_save(). A failed write on any rank is a kshard::Error on every
// rank from that step() or wait_for_save(). save(), load(), resume() and
// save_async() finish a pending save first; the destructor only waits for
// the write (no commit, no exception), so call wait_for_save() before the
// end of a run.
//
// A loaded trainer continues bitwise as the saving one would have on the
// same world size and mesh, given the same TrainerOptions otherwise (batch,
// accum, AdamW settings and clip are the caller's, not part of the state;
// the data position and the LR schedule are, so --steps-style loops just
// continue from step_count());
// on another world size or mesh the state is the same, the reductions add in
// another order. The schedule of the checkpoint replaces the one in the
// options. load() checks the trainer state in the manifest before it
// touches any tensor, so a checkpoint whose state cannot be restored leaves
// the trainer as it was. All three are collective over the world; an error
// on any rank (a missing or corrupt file, a state that does not parse) is a
// kshard::Error on every rank.
//
// evaluate() is the mean cross-entropy over a fixed set of windows of a
// TokenFile, defined independently of the world size and mesh: window j is
// tokens [j*seq, j*seq + seq], inputs its first seq tokens and targets the
// next token of each, j = 0 .. batches*batch - 1. Windows are dealt to the
// ranks of the world batch by batch (the last pass padded with ignored
// rows), each rank runs a forward-only pass (no gradients, no optimizer) and
// sums its rows' losses in double; one all_reduce adds sums and counts. So
// the result is the same for any world size and mesh up to the order of that
// double sum and the GEMMs' row blocking (a few ulps of fp32).
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <Kokkos_Core.hpp>

#include "kshard/checkpoint/async_save.hpp"
#include "kshard/checkpoint/checkpoint.hpp"
#include "kshard/engine/fsdp/fsdp_model.hpp"
#include "kshard/optim/loss_scaler.hpp"
#include "kshard/error.hpp"
#include "kshard/optim/fused_adam.hpp"
#include "kshard/optim/lr_schedule.hpp"
#include "kshard/train/token_file.hpp"
#include "kshard/train/token_source.hpp"
#include "kshard/train/trainer_state.hpp"

namespace kshard {

struct TrainerOptions {
  std::int64_t batch = 8;  ///< sequences per rank per micro-batch
  std::int64_t seq = 32;   ///< tokens per sequence
  int accum = 1;           ///< micro-batches per optimizer step
  /// AdamW settings; adam.lr is replaced at every step by the schedule's rate.
  AdamOptions adam;
  LrScheduleConfig schedule;
  double clip = 1.0;            ///< max global gradient norm, 0: no clipping
  std::uint64_t data_seed = 0;  ///< seed of the data stream (TokenSource::fill)
  /// Divergence guard: this many skipped (inf/NaN) steps in a row throw
  /// TrainingDiverged; 0: off.
  int max_skipped = 0;
  /// Dynamic loss scaling (recipes with loss_scaling, i.e. fp16).
  float initial_loss_scale = 4096.f;
  int loss_scale_growth_interval = 200;
};

/// What one step did.
struct StepReport {
  std::int64_t step = 0;     ///< steps taken so far, this one included (1-based)
  double loss = 0;           ///< mean over micro-batches and over the world's ranks
  double local_loss = 0;     ///< this rank's mean over its micro-batches
  double lr = 0;             ///< the rate this step used
  float loss_scale = 1.f;    ///< the loss scale this step used (1 without scaling)
  StepResult optimizer;      ///< skipped, grad_norm (NaN when skipped), clip_coef
  int consecutive_skipped = 0;
  /// The asynchronous save (save_async) this step committed at its start.
  std::optional<SaveInfo> committed_save;
};

struct EvalResult {
  double loss = 0;         ///< mean cross-entropy (nats per token)
  std::int64_t tokens = 0; ///< predictions averaged over (batches * batch * seq)
};

/// The divergence guard tripped (on every rank alike). report() is the step
/// that tripped it, for a caller that logs every step.
class TrainingDiverged : public Error {
 public:
  TrainingDiverged(std::string what, std::string expected, StepReport report = {})
      : Error(std::move(what), std::move(expected)), report_(report) {}
  const StepReport& report() const noexcept { return report_; }

 private:
  StepReport report_;
};

class Trainer {
 public:
  /// Takes the model (initialised or loaded) and builds the optimizer over
  /// all its units. Collective over model.mesh().world(); options are
  /// checked (kshard::Error).
  Trainer(FsdpModel model, TrainerOptions options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// One optimizer step on the next global batch of `data`. Collective.
  StepReport step(const TokenSource& data);
  /// Mean loss over the first batches * batch windows of `data` (see the
  /// header comment). Collective; between steps only.
  EvalResult evaluate(const TokenFile& data, std::int64_t batches);

  TrainerState state() const;
  /// Puts back a saved state (the parameters and moments are restored
  /// separately, through model() and optimizer()). Every rank must pass the
  /// same state; checked, kshard::Error.
  void restore(const TrainerState& state);

  /// Saves model, optimizer and state() as <dir>/step-<step_count()>
  /// (save_checkpoint; options.keep_last prunes). A pending asynchronous
  /// save is finished first (wait_for_save; its SaveInfo is dropped).
  /// Collective.
  SaveInfo save(const std::filesystem::path& dir, const SaveOptions& options = {});
  /// The same checkpoint, written asynchronously: returns once the state is
  /// copied to host memory; committed by a later step() (StepReport::
  /// committed_save) or wait_for_save(). A pending one is finished first.
  /// Collective.
  void save_async(const std::filesystem::path& dir, const SaveOptions& options = {});
  /// Allocates the host memory save_async copies the state into (pinned
  /// under CUDA, slow to allocate), so that the first save does not stop
  /// training for it (AsyncSaver::reserve). Optional. Local.
  void reserve_async_save();
  /// An asynchronous save is written or waiting for its commit. Local.
  bool save_pending() const noexcept;
  /// Waits for the pending asynchronous save and commits it (nullopt: none
  /// pending); a failed write on any rank is a kshard::Error on every rank.
  /// Collective.
  std::optional<SaveInfo> wait_for_save();
  /// Loads the checkpoint directory step_dir (a <dir>/step-N) into model,
  /// optimizer and state. Collective.
  LoadInfo load(const std::filesystem::path& step_dir);
  /// Loads the newest complete checkpoint of dir; nullopt (nothing changed)
  /// when there is none, or dir does not exist. Collective; ranks that see
  /// different newest checkpoints are an error.
  std::optional<LoadInfo> resume(const std::filesystem::path& dir);

  std::int64_t step_count() const noexcept { return step_; }
  FsdpModel& model() noexcept { return model_; }
  const FsdpModel& model() const noexcept { return model_; }
  FusedAdam& optimizer() noexcept { return *adam_; }
  const FusedAdam& optimizer() const noexcept { return *adam_; }
  const DynamicLossScaler& loss_scaler() const noexcept { return scaler_; }
  const LrSchedule& schedule() const noexcept { return schedule_; }
  const TrainerOptions& options() const noexcept { return options_; }
  /// Global sequences per step: accum * world * batch.
  std::int64_t sequences_per_step() const noexcept;

 private:
  void fill_host(const TokenSource& data);
  /// Throws kshard::Error when `s` cannot be restored. Local.
  void check_restorable(const TrainerState& s) const;

  // Declared first: destroyed last, after the optimizer that refers to its shards.
  FsdpModel model_;
  TrainerOptions options_;
  LrSchedule schedule_;
  std::unique_ptr<FusedAdam> adam_;
  DynamicLossScaler scaler_;
  std::int64_t step_ = 0, position_ = 0;
  int consecutive_skipped_ = 0;
  // One micro-batch on the device; all of a step's micro-batches on the host.
  Kokkos::View<std::int32_t*> ids_, targets_;
  std::vector<std::int32_t> ids_host_, targets_host_;
  // The asynchronous save and its host snapshot (kept across saves).
  std::unique_ptr<AsyncSaver> saver_;
};

}  // namespace kshard

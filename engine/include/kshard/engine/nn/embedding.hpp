#pragma once
// Embedding: token ids -> vectors, optionally plus learned position vectors.
//   y[r, :] = weight[id_r, :] (+ position[r % seq, :])
// The input holds one int32 token id per row (features = 1), through
// forward_tokens() (what FsdpModel::forward(ids) feeds it); forward() on ids
// stored as T is an error (not every id is exact in T). Ids must be in
// [0, vocab) (checked, kshard::Error: a wait for the device at each forward,
// or counted for the caller to read later, defer_token_check). dx is written
// as zeros: ids have no gradient.
// Params: "weight" [vocab, d] ~ N(0, 0.02) (GPT-2's init), and with
// max_seq > 0 also "position" [max_seq, d] ~ N(0, 0.02); seq must be <= max_seq.
//
//   kshard::Embedding<float> emb(/*vocab=*/50257, /*d=*/768, /*max_seq=*/1024);
//   emb.forward_tokens(ids, {batch, seq, 1}, params, y);   // y: [batch*seq, 768]
//
// Backward adds dy into the f32 (accum_t<T>) dweight, each id's rows summed
// in row order (no float atomics: bitwise reproducible); dposition sums dy
// over the batch.
#include "kshard/engine/nn/layer.hpp"

namespace kshard {

template <class T>
class Embedding final : public Layer<T> {
 public:
  using typename Layer<T>::ConstViews;
  using typename Layer<T>::GradViews;

  Embedding(std::int64_t vocab, std::int64_t d, std::int64_t max_seq = 0, double init_std = 0.02);

  std::string kind() const override { return "Embedding"; }
  std::vector<ParamSpec> param_specs() const override;
  std::int64_t in_features() const override { return 1; }
  std::int64_t out_features() const override { return d_; }
  std::int64_t vocab() const { return vocab_; }
  std::int64_t max_seq() const { return max_seq_; }

  /// Throws kshard::Error: token ids are int32 (forward_tokens), never
  /// stored as T.
  void forward(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
               Kokkos::View<T*> y) override;
  bool takes_token_ids() const override { return true; }
  bool assigns_grads() const override { return true; }
  void forward_tokens(Kokkos::View<const std::int32_t*> ids, ActShape shape,
                      const ConstViews& params, Kokkos::View<T*> y) override;
  void defer_token_check(Kokkos::View<double*> counter) override { deferred_check_ = counter; }
  void backward(Kokkos::View<const T*> dy, const ConstViews& params, const GradViews& grads,
                Kokkos::View<T*> dx) override;
  void release() override;
  /// Incremental decoding: row r's position is step.position + r % seq
  /// (position + seq <= max_seq), nothing saved.
  bool decodes() const override { return true; }
  void decode_tokens(Kokkos::View<const std::int32_t*> ids, ActShape shape,
                     const ConstViews& params, Kokkos::View<T*> y, DecodeStep<T>& step) override;

 private:
  std::int64_t vocab_, d_, max_seq_;
  double init_std_;
  bool saved_ = false;
  ActShape shape_{};
  Kokkos::View<const std::int32_t*> ids_;  // handle to the forward's ids
  Kokkos::View<double*> deferred_check_;   // defer_token_check's counter, or empty

  // The lookup on validated ids and shapes; saves the forward.
  void embed(Kokkos::View<const std::int32_t*> ids, ActShape shape, const ConstViews& params,
             Kokkos::View<T*> y);
};

#define KSHARD_EXTERN_LAYER(T) extern template class Embedding<T>;
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_EXTERN_LAYER)
#undef KSHARD_EXTERN_LAYER

}  // namespace kshard

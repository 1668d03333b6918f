#pragma once
// Embedding: token ids -> vectors, optionally plus learned position vectors.
//   y[r, :] = weight[id_r, :] (+ position[r % seq, :])
// The input x holds one token id per row, stored as T (features = 1), so an
// Embedding is a Layer like any other; ids must be integers in [0, vocab)
// (checked, kshard::Error). dx is written as zeros: ids have no gradient.
// Params: "weight" [vocab, d] ~ N(0, 0.02) (GPT-2's init), and with
// max_seq > 0 also "position" [max_seq, d] ~ N(0, 0.02); seq must be <= max_seq.
//
//   kshard::Embedding<float> emb(/*vocab=*/50257, /*d=*/768, /*max_seq=*/1024);
//   emb.forward(ids, {batch, seq, 1}, params, y);   // y: [batch*seq, 768]
//
// Backward scatters dy into dweight with atomic adds (repeated ids add up);
// dposition sums dy over the batch.
#include "kshard/engine/layer.hpp"

namespace kshard {

template <class T>
class Embedding final : public Layer<T> {
 public:
  using typename Layer<T>::ConstViews;
  using typename Layer<T>::Views;

  Embedding(std::int64_t vocab, std::int64_t d, std::int64_t max_seq = 0, double init_std = 0.02);

  std::string kind() const override { return "Embedding"; }
  std::vector<ParamSpec> param_specs() const override;
  std::int64_t in_features() const override { return 1; }
  std::int64_t out_features() const override { return d_; }
  std::int64_t vocab() const { return vocab_; }
  std::int64_t max_seq() const { return max_seq_; }

  void forward(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
               Kokkos::View<T*> y) override;
  void backward(Kokkos::View<const T*> dy, const ConstViews& params, const Views& grads,
                Kokkos::View<T*> dx) override;
  void release() override;

 private:
  std::int64_t vocab_, d_, max_seq_;
  double init_std_;
  bool saved_ = false;
  ActShape shape_{};
  Kokkos::View<const T*> ids_;
};

extern template class Embedding<float>;
extern template class Embedding<double>;

}  // namespace kshard

#include "kshard/engine/embedding.hpp"
#include "kshard/compat/kokkos.hpp"

#include <cmath>

#include "kshard/error.hpp"

namespace kshard {

namespace detail::embedding {

// Number of ids that are not integers in [0, vocab).
template <class T>
std::int64_t count_bad_ids(Kokkos::View<const T*> ids, std::int64_t vocab) {
  std::int64_t bad = 0;
  Kokkos::parallel_reduce(
      "kshard::embedding_check_ids", Kokkos::RangePolicy<>(0, static_cast<std::int64_t>(ids.extent(0))),
      KOKKOS_LAMBDA(std::int64_t r, std::int64_t& b) {
        const T v = ids(r);
        const bool ok = v >= T(0) && v < T(vocab) && v == compat::floor(v);
        b += ok ? 0 : 1;
      },
      bad);
  return bad;
}

template <class T>
void forward(Kokkos::View<const T*> ids, Kokkos::View<const T*> weight,
             Kokkos::View<const T*> position, bool use_position, Kokkos::View<T*> y,
             std::int64_t rows, std::int64_t seq, std::int64_t d) {
  Kokkos::parallel_for(
      "kshard::embedding_forward", Kokkos::RangePolicy<>(0, rows * d),
      KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t r = i / d, c = i % d;
        const std::int64_t id = static_cast<std::int64_t>(ids(r));
        T v = weight(id * d + c);
        if (use_position) v += position((r % seq) * d + c);
        y(i) = v;
      });
}

template <class T>
void backward(Kokkos::View<const T*> ids, Kokkos::View<const T*> dy, Kokkos::View<T*> dweight,
              Kokkos::View<T*> dposition, bool use_position, std::int64_t batch,
              std::int64_t seq, std::int64_t d) {
  Kokkos::parallel_for(
      "kshard::embedding_backward_weight", Kokkos::RangePolicy<>(0, batch * seq * d),
      KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t r = i / d, c = i % d;
        const std::int64_t id = static_cast<std::int64_t>(ids(r));
        Kokkos::atomic_add(&dweight(id * d + c), dy(i));
      });
  if (!use_position) return;
  Kokkos::parallel_for(
      "kshard::embedding_backward_position", Kokkos::RangePolicy<>(0, seq * d),
      KOKKOS_LAMBDA(std::int64_t i) {
        T s = 0;
        for (std::int64_t b = 0; b < batch; ++b) s += dy(b * seq * d + i);
        dposition(i) += s;
      });
}

}  // namespace detail::embedding

template <class T>
Embedding<T>::Embedding(std::int64_t vocab, std::int64_t d, std::int64_t max_seq,
                        double init_std)
    : vocab_(vocab), d_(d), max_seq_(max_seq), init_std_(init_std) {
  if (vocab_ <= 0 || d_ <= 0 || max_seq_ < 0)
    throw Error("Embedding(vocab=" + std::to_string(vocab_) + ", d=" + std::to_string(d_) +
                    ", max_seq=" + std::to_string(max_seq_) + ")",
                "vocab > 0, d > 0, max_seq >= 0");
  // Ids travel as T: every id must be exactly representable.
  if (static_cast<std::int64_t>(static_cast<T>(vocab_ - 1)) != vocab_ - 1)
    throw Error("Embedding vocab=" + std::to_string(vocab_) + " is not exact in this scalar type",
                "vocab <= 2^24 for float ids");
}

template <class T>
std::vector<ParamSpec> Embedding<T>::param_specs() const {
  std::vector<ParamSpec> s{{"weight", {vocab_, d_}, Init::normal(init_std_)}};
  if (max_seq_ > 0) s.push_back({"position", {max_seq_, d_}, Init::normal(init_std_)});
  return s;
}

template <class T>
void Embedding<T>::forward(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
                           Kokkos::View<T*> y) {
  detail::check_forward<T>(*this, x, shape, params, y);
  if (max_seq_ > 0 && shape.seq > max_seq_)
    throw Error("Embedding::forward: seq=" + std::to_string(shape.seq),
                "seq <= max_seq=" + std::to_string(max_seq_));
  const std::int64_t bad = detail::embedding::count_bad_ids<T>(x, vocab_);
  if (bad != 0)
    throw Error("Embedding::forward: " + std::to_string(bad) + " token ids are not integers in [0, " +
                    std::to_string(vocab_) + ")",
                "every id an integer in [0, vocab)");
  const bool pos = max_seq_ > 0;
  detail::embedding::forward<T>(x, params[0], pos ? params[1] : Kokkos::View<const T*>(), pos, y,
                                shape.rows(), shape.seq, d_);
  ids_ = x;
  shape_ = shape;
  saved_ = true;
}

template <class T>
void Embedding<T>::backward(Kokkos::View<const T*> dy, const ConstViews& params,
                            const Views& grads, Kokkos::View<T*> dx) {
  detail::check_backward<T>(*this, saved_, shape_, dy, params, grads, dx);
  const bool pos = max_seq_ > 0;
  detail::embedding::backward<T>(ids_, dy, grads[0], pos ? grads[1] : Kokkos::View<T*>(), pos,
                                 shape_.batch, shape_.seq, d_);
  Kokkos::deep_copy(dx, T(0));
}

template <class T>
void Embedding<T>::release() {
  ids_ = {};
  saved_ = false;
}

template class Embedding<float>;
template class Embedding<double>;

}  // namespace kshard

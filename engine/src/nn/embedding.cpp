#include "kshard/engine/nn/embedding.hpp"
#include "kshard/kernels/cast.hpp"
#include "kshard/compat/for_each.hpp"
#include "kshard/compat/kokkos.hpp"

#include <climits>
#include <cmath>
#include <cstdint>

#include "kshard/error.hpp"
#include "kshard/core/buffer_pool.hpp"

namespace kshard {

namespace detail::embedding {

// Every kernel reads an id through this: one outside [0, vocab) stands for
// row 0, so no kernel reads or writes outside the table. Such ids are errors
// (checked before the forward, or counted for a later check: the step's
// results are then not used); this only keeps memory safe meanwhile.
KOKKOS_INLINE_FUNCTION std::int32_t table_row(std::int32_t id, std::int64_t vocab) {
  return id >= 0 && id < vocab ? id : 0;
}

// Row r holds the token at position first + r % seq: first is 0 in training,
// the cached tokens' count in incremental decoding.
template <class T>
void forward(Kokkos::View<const std::int32_t*> ids, Kokkos::View<const T*> weight,
             Kokkos::View<const T*> position, bool use_position, Kokkos::View<T*> y,
             std::int64_t rows, std::int64_t seq, std::int64_t d, std::int64_t vocab,
             std::int64_t first = 0) {
  compat::for_each_row(
      "kshard::embedding_forward", rows, d, KOKKOS_LAMBDA(std::int64_t r, std::int64_t c) {
        const std::int64_t i = r * d + c;
        const std::int64_t id = table_row(ids(r), vocab);
        if (use_position)
          y(i) = from_accum<T>(to_accum(weight(id * d + c)) +
                               to_accum(position((first + r % seq) * d + c)));
        else
          y(i) = weight(id * d + c);
      });
}

// Column c of the rows in one token id's bucket [lo, hi) of `order`, summed
// in row order (both weight-gradient kernels below: the same bits).
template <class T, class Order, class I>
KOKKOS_INLINE_FUNCTION accum_t<T> bucket_sum(const Kokkos::View<const T*>& dy, const Order& order,
                                              I lo, I hi, std::int64_t d, std::int64_t c) {
  accum_t<T> s = 0;
  for (I q = lo; q < hi; ++q) s += to_accum(dy(std::int64_t(order(q)) * d + c));
  return s;
}

template <class T>
void backward(Kokkos::View<const std::int32_t*> ids, Kokkos::View<const T*> dy,
              Kokkos::View<accum_t<T>*> dweight, Kokkos::View<accum_t<T>*> dposition,
              bool use_position, std::int64_t batch, std::int64_t seq, std::int64_t d,
              std::int64_t vocab, GradWrite write) {
  using A = accum_t<T>;
  // The weight gradient is deterministic: each token id's rows are summed in
  // row order, not with float atomics (whose order varies from run to run on
  // a GPU), so a step is bitwise repeatable and a resumed run retraces the
  // uninterrupted one. Rows are bucketed by id with integer atomics (exact),
  // each bucket is put in row order (a row's place is the number of rows of
  // its bucket before it: O(bucket^2) work, small for real text), then each
  // bucket's rows are summed by one team. No host synchronisation, and the
  // workspaces are pool blocks: nothing is allocated in a steady-state step.
  const std::int64_t rows = batch * seq;
  using I = std::int32_t;
  auto offsets_s = detail::scratch<I>(vocab + 1, "kshard::Embedding::offsets");
  auto cursor_s = detail::scratch<I>(vocab, "kshard::Embedding::cursor");
  auto slots_s = detail::scratch<I>(rows, "kshard::Embedding::slots");
  auto order_s = detail::scratch<I>(rows, "kshard::Embedding::order");
  auto offsets = offsets_s.view;
  auto cursor = cursor_s.view;
  auto slots = slots_s.view;
  auto order = order_s.view;
  compat::for_each_index(
      "kshard::embedding_zero_counts", vocab + 1, KOKKOS_LAMBDA(std::int64_t v) {
        offsets(v) = 0;
        if (v < vocab) cursor(v) = 0;
      });
  compat::for_each_index(
      "kshard::embedding_count_ids", rows,
      KOKKOS_LAMBDA(std::int64_t r) { Kokkos::atomic_add(&offsets(table_row(ids(r), vocab)), I(1)); });
  // Exclusive scan of the counts, in place: offsets(v) = rows with id < v,
  // offsets(vocab) = rows. (Each i reads its count before writing it.)
  Kokkos::parallel_scan(
      "kshard::embedding_bucket_offsets", Kokkos::RangePolicy<>(0, vocab + 1),
      KOKKOS_LAMBDA(std::int64_t v, I& update, bool final) {
        const I c = offsets(v);
        if (final) offsets(v) = update;
        update += c;
      });
  compat::for_each_index(
      "kshard::embedding_fill_buckets", rows, KOKKOS_LAMBDA(std::int64_t r) {
        const I id = table_row(ids(r), vocab);
        slots(offsets(id) + Kokkos::atomic_fetch_add(&cursor(id), I(1))) = I(r);
      });
  compat::for_each_index(
      "kshard::embedding_order_buckets", rows, KOKKOS_LAMBDA(std::int64_t p) {
        const I r = slots(p);
        const I id = table_row(ids(r), vocab);
        const I lo = offsets(id), hi = offsets(id + 1);
        I before = 0;
        for (I q = lo; q < hi; ++q) before += slots(q) < r ? 1 : 0;
        order(lo + before) = r;
      });
  if (write == GradWrite::assign) {
    // Every row of the table is written: one team per token id, zero for an
    // id no row has (the fill the caller skipped), the same row-order sums
    // as the add path's otherwise.
    compat::for_each_row(
        "kshard::embedding_backward_weight_assign", vocab, d,
        KOKKOS_LAMBDA(std::int64_t id, std::int64_t c) {
          dweight(id * d + c) = bucket_sum<T>(dy, order, offsets(id), offsets(id + 1), d, c);
        });
  } else {
    compat::for_each_row(
        "kshard::embedding_backward_weight", rows, d,
        KOKKOS_LAMBDA(std::int64_t p, std::int64_t c) {
          const I id = table_row(ids(order(p)), vocab);
          const I lo = offsets(id);
          if (p != lo) return;  // one team per bucket: the one at its first place
          dweight(std::int64_t(id) * d + c) += bucket_sum<T>(dy, order, lo, offsets(id + 1), d, c);
        });
  }
  if (!use_position) return;
  // Assigning writes the whole table: positions past seq get zero.
  const bool assign = write == GradWrite::assign;
  const std::int64_t n = assign ? std::int64_t(dposition.extent(0)) : seq * d;
  Kokkos::parallel_for(
      "kshard::embedding_backward_position", Kokkos::RangePolicy<>(0, n),
      KOKKOS_LAMBDA(std::int64_t i) {
        A s = 0;
        if (i < seq * d)
          for (std::int64_t b = 0; b < batch; ++b) s += to_accum(dy(b * seq * d + i));
        dposition(i) = assign ? s : dposition(i) + s;
      });
}

// An atomic count rather than a Kokkos reduction: bad ids are rare, so the
// atomics almost never run, and Kokkos 3.4's CUDA reduction exchanges partial
// sums in shared memory without warp synchronisation, which
// compute-sanitizer's racecheck reports as hazards in every training step.
void count_bad_ids_into(Kokkos::View<const std::int32_t*> ids, std::int64_t vocab,
                        Kokkos::View<double*> counter) {
  compat::for_each_index(
      "kshard::embedding_count_bad_ids", static_cast<std::int64_t>(ids.extent(0)),
      KOKKOS_LAMBDA(std::int64_t r) {
        if (!(ids(r) >= 0 && ids(r) < vocab)) Kokkos::atomic_add(&counter(0), 1.0);
      });
}

// The same count, waited for.
std::int64_t count_bad_ids(Kokkos::View<const std::int32_t*> ids, std::int64_t vocab) {
  memory::Block block = memory::acquire(sizeof(double), "kshard::embedding_bad_ids");
  const auto count = block.view<double>(1);
  Kokkos::deep_copy(count, 0.0);
  count_bad_ids_into(ids, vocab, count);
  double bad = 0;
  Kokkos::deep_copy(bad, Kokkos::subview(count, 0));  // fences
  return static_cast<std::int64_t>(bad);
}

}  // namespace detail::embedding

namespace {
void check_ids(std::int64_t bad, std::int64_t vocab) {
  if (bad != 0)
    throw Error("Embedding::forward: " + std::to_string(bad) +
                    " token ids are not integers in [0, " + std::to_string(vocab) + ")",
                "every id an integer in [0, vocab)");
}
void check_seq(const ActShape& shape, std::int64_t max_seq) {
  if (max_seq > 0 && shape.seq > max_seq)
    throw Error("Embedding::forward: seq=" + std::to_string(shape.seq),
                "seq <= max_seq=" + std::to_string(max_seq));
}
}  // namespace

template <class T>
Embedding<T>::Embedding(std::int64_t vocab, std::int64_t d, std::int64_t max_seq,
                        double init_std)
    : vocab_(vocab), d_(d), max_seq_(max_seq), init_std_(init_std) {
  if (vocab_ <= 0 || d_ <= 0 || max_seq_ < 0)
    throw Error("Embedding(vocab=" + std::to_string(vocab_) + ", d=" + std::to_string(d_) +
                    ", max_seq=" + std::to_string(max_seq_) + ")",
                "vocab > 0, d > 0, max_seq >= 0");
  // int32 ids (forward_tokens) hold any vocab that fits an int32.
  if (vocab_ > std::int64_t(INT32_MAX))
    throw Error("Embedding vocab=" + std::to_string(vocab_), "vocab <= 2^31 - 1 (int32 ids)");
}

template <class T>
std::vector<ParamSpec> Embedding<T>::param_specs() const {
  std::vector<ParamSpec> s{{"weight", {vocab_, d_}, Init::normal(init_std_)}};
  if (max_seq_ > 0) s.push_back({"position", {max_seq_, d_}, Init::normal(init_std_)});
  return s;
}

template <class T>
void Embedding<T>::forward(Kokkos::View<const T*>, ActShape, const ConstViews&, Kokkos::View<T*>) {
  // Ids stored as T are exact only up to 256 (bf16), 2048 (f16), 2^24 (f32):
  // token ids are int32, always.
  throw Error("Embedding<" + std::string(dtype_name(dtype_of<T>::value)) +
                  ">::forward with token ids stored as " + dtype_name(dtype_of<T>::value),
              "int32 token ids through forward_tokens() (FsdpModel::forward(ids) does this)");
}

template <class T>
void Embedding<T>::forward_tokens(Kokkos::View<const std::int32_t*> ids, ActShape shape,
                                  const ConstViews& params, Kokkos::View<T*> y) {
  const std::string who = "Embedding::forward_tokens";
  if (shape.batch <= 0 || shape.seq <= 0 || shape.features != 1)
    throw Error(who + ": ActShape batch=" + std::to_string(shape.batch) +
                    ", seq=" + std::to_string(shape.seq) +
                    ", features=" + std::to_string(shape.features),
                "batch > 0, seq > 0, features = 1 (one id per row)");
  detail::check_size(who, "ids", ids.extent(0), shape.rows());
  detail::check_size(who, "y", y.extent(0), shape.rows() * d_);
  detail::check_param_views<T>(*this, who, params);
  check_seq(shape, max_seq_);
  if (deferred_check_.extent(0) != 0)
    detail::embedding::count_bad_ids_into(ids, vocab_, deferred_check_);  // no wait
  else
    check_ids(detail::embedding::count_bad_ids(ids, vocab_), vocab_);
  embed(ids, shape, params, y);
}

template <class T>
void Embedding<T>::embed(Kokkos::View<const std::int32_t*> ids, ActShape shape,
                         const ConstViews& params, Kokkos::View<T*> y) {
  const bool pos = max_seq_ > 0;
  detail::embedding::forward<T>(ids, params[0], pos ? params[1] : Kokkos::View<const T*>(), pos, y,
                                shape.rows(), shape.seq, d_, vocab_);
  ids_ = ids;
  shape_ = shape;
  saved_ = true;
}

template <class T>
void Embedding<T>::decode_tokens(Kokkos::View<const std::int32_t*> ids, ActShape shape,
                                 const ConstViews& params, Kokkos::View<T*> y,
                                 DecodeStep<T>& step) {
  const std::string who = "Embedding::decode_tokens";
  if (shape.batch <= 0 || shape.seq <= 0 || shape.features != 1 || step.position < 0)
    throw Error(who + ": ActShape batch=" + std::to_string(shape.batch) +
                    ", seq=" + std::to_string(shape.seq) +
                    ", features=" + std::to_string(shape.features) +
                    " at position " + std::to_string(step.position),
                "batch > 0, seq > 0, features = 1 (one id per row), position >= 0");
  detail::check_size(who, "ids", ids.extent(0), shape.rows());
  detail::check_size(who, "y", y.extent(0), shape.rows() * d_);
  detail::check_param_views<T>(*this, who, params);
  if (max_seq_ > 0 && step.position + shape.seq > max_seq_)
    throw Error(who + ": tokens at positions up to " + std::to_string(step.position + shape.seq - 1),
                "positions < max_seq=" + std::to_string(max_seq_) + " (the position table)");
  check_ids(detail::embedding::count_bad_ids(ids, vocab_), vocab_);
  release();
  // The forward's lookup with the positions shifted by the cached tokens.
  const bool pos = max_seq_ > 0;
  detail::embedding::forward<T>(ids, params[0], pos ? params[1] : Kokkos::View<const T*>(), pos, y,
                                shape.rows(), shape.seq, d_, vocab_, step.position);
}

template <class T>
void Embedding<T>::backward(Kokkos::View<const T*> dy, const ConstViews& params,
                            const GradViews& grads, Kokkos::View<T*> dx) {
  detail::check_backward<T>(*this, saved_, shape_, dy, params, grads, dx);
  const bool pos = max_seq_ > 0;
  detail::embedding::backward<T>(ids_, dy, grads[0],
                                 pos ? grads[1] : Kokkos::View<accum_t<T>*>(), pos, shape_.batch,
                                 shape_.seq, d_, vocab_, this->take_grad_write());
  // (A fill kernel, not deep_copy: Kokkos 3.4's deep_copy of a value fences.)
  fill<T>(dx, from_accum<T>(accum_t<T>(0)));
}

template <class T>
void Embedding<T>::release() {
  ids_ = {};
  saved_ = false;
}

#define KSHARD_INSTANTIATE_LAYER(T) template class Embedding<T>;
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_INSTANTIATE_LAYER)
#undef KSHARD_INSTANTIATE_LAYER

}  // namespace kshard

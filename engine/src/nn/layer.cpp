#include "kshard/engine/nn/layer.hpp"
#include "kshard/compat/for_each.hpp"

#include <string>

#include "kshard/kernels/cast.hpp"
#include "kshard/kernels/gemm.hpp"
#include "kshard/kernels/elementwise_stream.hpp"
#include "kshard/error.hpp"

namespace kshard {

std::string shape_text(const std::vector<std::int64_t>& s) {
  std::string r = "[";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

std::int64_t ParamSpec::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::int64_t param_numel(const std::vector<ParamSpec>& specs) {
  std::int64_t n = 0;
  for (const auto& s : specs) n += s.numel();
  return n;
}

template <class T>
std::vector<Kokkos::View<T*>> allocate_parameters(const Layer<T>& layer) {
  std::vector<Kokkos::View<T*>> v;
  for (const auto& s : layer.param_specs())
    v.emplace_back(Kokkos::View<T*>(s.name, static_cast<std::size_t>(s.numel())));
  return v;
}

template <class T>
std::vector<Kokkos::View<accum_t<T>*>> allocate_gradients(const Layer<T>& layer) {
  std::vector<Kokkos::View<accum_t<T>*>> v;
  for (const auto& s : layer.param_specs())
    v.emplace_back(Kokkos::View<accum_t<T>*>(s.name + ".grad", static_cast<std::size_t>(s.numel())));
  return v;
}

template <class T>
void Layer<T>::forward_tokens(Kokkos::View<const std::int32_t*>, ActShape, const ConstViews&,
                              Kokkos::View<T*>) {
  throw Error(kind() + "::forward_tokens: this layer takes features, not token ids",
              "token ids only for a layer whose takes_token_ids() is true (Embedding)");
}

template <class T>
void Layer<T>::decode(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
                      Kokkos::View<T*> y, DecodeStep<T>& step) {
  (void)step;
  if (!rows_independent())
    throw Error(kind() + "::decode: this layer has no incremental decoding",
                "layers whose rows are independent, attention layers (TransformerLayer, "
                "LlamaLayer, CausalSelfAttention) and an Embedding first");
  // Each row depends on its own input alone: the new rows are the forward's.
  forward(x, shape, params, y);
  release();
}

template <class T>
void Layer<T>::decode_tokens(Kokkos::View<const std::int32_t*>, ActShape, const ConstViews&,
                             Kokkos::View<T*>, DecodeStep<T>&) {
  throw Error(kind() + "::decode_tokens: this layer takes features, not token ids",
              "token ids only for a layer whose takes_token_ids() is true (Embedding)");
}

template <class T>
void Layer<T>::set_grad_write(GradWrite w) {
  if (w == GradWrite::none)
    throw Error(kind() + "::set_grad_write(none)", "add or assign (a backward writes its gradients)");
  if (w == GradWrite::assign && !assigns_grads())
    throw Error(kind() + "::set_grad_write(assign): this layer only adds to its gradients",
                "assign only for a layer whose assigns_grads() is true");
  grad_write_ = w;
}

template <class T>
void init_parameters(const Layer<T>& layer, const std::vector<Kokkos::View<T*>>& params,
                     std::uint64_t seed, const std::string& prefix) {
  const auto specs = layer.param_specs();
  if (params.size() != specs.size())
    throw Error(layer.kind() + " init_parameters: " + std::to_string(params.size()) + " Views",
                std::to_string(specs.size()) + " (one per ParamSpec)");
  for (std::size_t i = 0; i < specs.size(); ++i) {
    detail::check_size(layer.kind() + " init_parameters", specs[i].name.c_str(),
                       params[i].extent(0), specs[i].numel());
    if constexpr (is_low_precision_v<T>) {
      Kokkos::View<float*> f(Kokkos::view_alloc(std::string("kshard::init_f32"),
                                                Kokkos::WithoutInitializing),
                             params[i].extent(0));
      fill_init<float>(f, specs[i].init, seed, prefix + specs[i].name);
      cast_from_f32<T>(f, params[i]);
    } else {
      fill_init<T>(params[i], specs[i].init, seed, prefix + specs[i].name);
    }
  }
}

namespace detail {

void check_size(const std::string& who, const char* what, std::size_t have, std::int64_t want) {
  if (static_cast<std::int64_t>(have) != want)
    throw Error(who + ": " + what + " has " + std::to_string(have) + " elements",
                std::to_string(want) + " elements");
}

namespace {
template <class T, class V>
void check_params(const Layer<T>& layer, const std::string& who, const char* what,
                  const std::vector<ParamSpec>& specs, const std::vector<V>& views) {
  if (views.size() != specs.size())
    throw Error(who + ": " + std::to_string(views.size()) + " " + what + " Views",
                std::to_string(specs.size()) + " (one per ParamSpec of " + layer.kind() + ")");
  for (std::size_t i = 0; i < specs.size(); ++i)
    if (static_cast<std::int64_t>(views[i].extent(0)) != specs[i].numel())
      throw Error(who + ": " + what + " '" + specs[i].name + "' has " +
                      std::to_string(views[i].extent(0)) + " elements",
                  std::to_string(specs[i].numel()) + " (shape " + shape_text(specs[i].shape) +
                      ")");
}
}  // namespace

template <class T>
void check_param_views(const Layer<T>& layer, const std::string& who,
                       const std::vector<Kokkos::View<const T*>>& params) {
  check_params(layer, who, "param", layer.param_specs(), params);
}

template <class T>
void check_forward(const Layer<T>& layer, const Kokkos::View<const T*>& x, const ActShape& shape,
                   const std::vector<Kokkos::View<const T*>>& params, const Kokkos::View<T*>& y) {
  const std::string who = layer.kind() + "::forward";
  if (shape.batch <= 0 || shape.seq <= 0)
    throw Error(who + ": ActShape batch=" + std::to_string(shape.batch) +
                    ", seq=" + std::to_string(shape.seq),
                "batch > 0 and seq > 0");
  if (shape.features != layer.in_features())
    throw Error(who + ": ActShape features=" + std::to_string(shape.features),
                "in_features=" + std::to_string(layer.in_features()));
  check_size(who, "x", x.extent(0), shape.rows() * layer.in_features());
  check_size(who, "y", y.extent(0), shape.rows() * layer.out_features());
  check_params(layer, who, "param", layer.param_specs(), params);
}

template <class T>
void check_backward(const Layer<T>& layer, bool have_forward, const ActShape& shape,
                    const Kokkos::View<const T*>& dy,
                    const std::vector<Kokkos::View<const T*>>& params,
                    const std::vector<Kokkos::View<accum_t<T>*>>& grads,
                    const Kokkos::View<T*>& dx) {
  const std::string who = layer.kind() + "::backward";
  if (!have_forward)
    throw Error(who + " called with no saved forward", "forward() first (and no release())");
  check_size(who, "dy", dy.extent(0), shape.rows() * layer.out_features());
  check_size(who, "dx", dx.extent(0), shape.rows() * layer.in_features());
  const auto specs = layer.param_specs();
  check_params(layer, who, "param", specs, params);
  check_params(layer, who, "grad", specs, grads);
}

template <class T>
void add_row_vector(Kokkos::View<T*> y, Kokkos::View<const T*> b, std::int64_t rows,
                    std::int64_t cols) {
  compat::for_each_row(
      "kshard::add_row_vector", rows, cols, KOKKOS_LAMBDA(std::int64_t r, std::int64_t c) {
        const std::int64_t i = r * cols + c;
        y(i) = from_accum<T>(to_accum(y(i)) + to_accum(b(c)));
      });
}

template <class U>
void accumulate_column_sums(Kokkos::View<const U*> dy, std::int64_t rows, std::int64_t cols,
                            Kokkos::View<accum_t<U>*> db, Kokkos::View<U*>& ones,
                            GradWrite write) {
  if (static_cast<std::int64_t>(ones.extent(0)) != rows) {
    ones = Kokkos::View<U*>(Kokkos::view_alloc(std::string("kshard::ones"),
                                               Kokkos::WithoutInitializing),
                            static_cast<std::size_t>(rows));
    Kokkos::deep_copy(ones, from_accum<U>(accum_t<U>(1)));
  }
  // db[1, cols] += ones[1, rows] * dy[rows, cols]  (beta 0: db not read)
  using A = accum_t<U>;
  gemm<U>(Trans::N, Trans::N, 1, cols, rows, A(1), ones.data(), rows, dy.data(), cols,
          write == GradWrite::assign ? A(0) : A(1), db.data(), cols);
}

template <class T>
void add(Kokkos::View<const T*> a, Kokkos::View<const T*> b, Kokkos::View<T*> out) {
  if (add_stream<T>(a.data(), b.data(), out.data(), std::int64_t(out.extent(0)))) return;
  compat::for_each_index(
      "kshard::add", static_cast<std::int64_t>(out.extent(0)),
      KOKKOS_LAMBDA(std::int64_t i) { out(i) = from_accum<T>(to_accum(a(i)) + to_accum(b(i))); });
}

#define KSHARD_LAYER_INSTANTIATE(T)                                                            \
  template void check_forward<T>(const Layer<T>&, const Kokkos::View<const T*>&,              \
                                 const ActShape&, const std::vector<Kokkos::View<const T*>>&, \
                                 const Kokkos::View<T*>&);                                    \
  template void check_backward<T>(const Layer<T>&, bool, const ActShape&,                     \
                                  const Kokkos::View<const T*>&,                              \
                                  const std::vector<Kokkos::View<const T*>>&,                 \
                                  const std::vector<Kokkos::View<accum_t<T>*>>&,              \
                                  const Kokkos::View<T*>&);                                   \
  template void add_row_vector<T>(Kokkos::View<T*>, Kokkos::View<const T*>, std::int64_t,     \
                                  std::int64_t);                                              \
  template void accumulate_column_sums<T>(Kokkos::View<const T*>, std::int64_t, std::int64_t, \
                                          Kokkos::View<accum_t<T>*>, Kokkos::View<T*>&,       \
                                          GradWrite);                                         \
  template void add<T>(Kokkos::View<const T*>, Kokkos::View<const T*>, Kokkos::View<T*>); \
  template void check_param_views<T>(const Layer<T>&, const std::string&,                    \
                                     const std::vector<Kokkos::View<const T*>>&);
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_LAYER_INSTANTIATE)
#undef KSHARD_LAYER_INSTANTIATE
}  // namespace detail

#define KSHARD_LAYER_FREE_INSTANTIATE(T)                                                     \
  template class Layer<T>;                                                                    \
  template std::vector<Kokkos::View<T*>> allocate_parameters<T>(const Layer<T>&);             \
  template std::vector<Kokkos::View<accum_t<T>*>> allocate_gradients<T>(const Layer<T>&);     \
  template void init_parameters<T>(const Layer<T>&, const std::vector<Kokkos::View<T*>>&,     \
                                   std::uint64_t, const std::string&);
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_LAYER_FREE_INSTANTIATE)
#undef KSHARD_LAYER_FREE_INSTANTIATE

}  // namespace kshard

#include "kshard/engine/nn/linear.hpp"

#include "kshard/kernels/gelu.hpp"
#include "kshard/kernels/gemm.hpp"
#include "kshard/kernels/linear_epilogue.hpp"
#include "fp8_linear.hpp"
#include "kshard/error.hpp"

namespace kshard {

template <class T>
Linear<T>::Linear(std::int64_t in_features, std::int64_t out_features, bool bias)
    : in_(in_features), out_(out_features), bias_(bias) {
  if (in_ <= 0 || out_ <= 0)
    throw Error("Linear(" + std::to_string(in_) + ", " + std::to_string(out_) + ")",
                "in_features > 0 and out_features > 0");
}

template <class T>
Linear<T>::~Linear() = default;

template <class T>
void Linear<T>::set_fp8_policy(const Fp8Policy& policy) {
  if constexpr (std::is_same_v<T, bfloat16_t>) {
    fp8_ = policy.enabled() ? std::make_unique<detail::Fp8Linear>(policy) : nullptr;
  } else {
    (void)policy;
  }
}

template <class T>
void Linear<T>::fp8_scales(std::vector<Fp8Scale*>& out) {
  if (fp8_) fp8_->scales(out);
}

namespace {
// The fp8 path for a forward of `rows` rows, or null (bf16 T only).
template <class T>
detail::Fp8Linear* fp8_path(const std::unique_ptr<detail::Fp8Linear>& fp8, std::int64_t rows,
                            std::int64_t in, std::int64_t out) {
  if constexpr (std::is_same_v<T, bfloat16_t>)
    return fp8 && fp8->fits(rows, in, out) ? fp8.get() : nullptr;
  (void)fp8, (void)rows, (void)in, (void)out;
  return nullptr;
}
}  // namespace

template <class T>
bool Linear<T>::save_and_try_fp8(Kokkos::View<const T*> x, ActShape shape,
                                 const ConstViews& params, Fp8Epilogue e, Kokkos::View<T*> y,
                                 T* pre, Fp8Input input) {
  x_ = x;
  shape_ = shape;
  saved_ = true;
  fp8_forward_ = false;
  fp8_input_ = input;
  if constexpr (std::is_same_v<T, bfloat16_t>) {
    if (auto* f = fp8_path<T>(fp8_, shape.rows(), in_, out_)) {
      f->forward(x, shape.rows(), in_, out_, params[0], bias_ ? params[1].data() : nullptr, e,
                 y.data(), pre, input);
      fp8_forward_ = true;
    }
  } else {
    (void)params, (void)e, (void)y, (void)pre;
  }
  return fp8_forward_;
}

template <class T>
bool Linear<T>::fp8_runs(std::int64_t rows) const {
  return fp8_path<T>(fp8_, rows, in_, out_) != nullptr;
}

template <class T>
void Linear<T>::forward_fp8_of_gelu(Kokkos::View<const T*> pre, ActShape shape,
                                    const ConstViews& params, Kokkos::View<T*> y) {
  detail::check_forward<T>(*this, pre, shape, params, y);
  if (!fp8_runs(shape.rows()))
    throw Error("Linear::forward_fp8_of_gelu where the forward would not run in fp8",
                "an fp8 policy, bf16 and a shape the fp8 GEMMs take (Linear::fp8_runs)");
  save_and_try_fp8(pre, shape, params, bias_ ? Fp8Epilogue::bias : Fp8Epilogue::none, y, nullptr,
                   Fp8Input::gelu_of_x);
}

template <class T>
std::vector<ParamSpec> Linear<T>::param_specs() const {
  std::vector<ParamSpec> s{{"weight", {out_, in_}, Init::uniform_fan_in(in_)}};
  if (bias_) s.push_back({"bias", {out_}, Init::uniform_fan_in(in_)});
  return s;
}

template <class T>
void Linear<T>::forward(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
                        Kokkos::View<T*> y) {
  detail::check_forward<T>(*this, x, shape, params, y);
  const std::int64_t rows = shape.rows();
  using A = accum_t<T>;
  if (save_and_try_fp8(x, shape, params, bias_ ? Fp8Epilogue::bias : Fp8Epilogue::none, y,
                       nullptr))
    return;
  // With a bias: in the GEMM's epilogue where the backend has one.
  if (!bias_ || !detail::linear_epilogue_backend<T>(rows, in_, out_, x.data(), params[0].data(),
                                                    params[1].data(), y.data(),
                                                    detail::LinearEpilogue::bias, nullptr)) {
    gemm<T>(Trans::N, Trans::T, rows, out_, in_, A(1), x, params[0], A(0), y);
    if (bias_) detail::add_row_vector<T>(y, params[1], rows, out_);
  }
}

template <class T>
void Linear<T>::forward_gelu(Kokkos::View<const T*> x, ActShape shape, const ConstViews& params,
                             Kokkos::View<T*> pre, Kokkos::View<T*> y) {
  detail::check_forward<T>(*this, x, shape, params, y);
  const std::int64_t rows = shape.rows();
  if (!bias_ || std::int64_t(pre.extent(0)) != rows * out_)
    throw Error("Linear::forward_gelu with " + std::string(bias_ ? "" : "no bias and ") +
                    "a pre-activation of " + std::to_string(pre.extent(0)) + " elements",
                "a Linear with bias and a pre-activation of rows x out = " +
                    std::to_string(rows * out_) + " elements");
  if (save_and_try_fp8(x, shape, params, Fp8Epilogue::bias_gelu, y, pre.data())) return;
  if (!detail::linear_epilogue_backend<T>(rows, in_, out_, x.data(), params[0].data(),
                                          params[1].data(), y.data(),
                                          detail::LinearEpilogue::bias_gelu, pre.data())) {
    using A = accum_t<T>;
    gemm<T>(Trans::N, Trans::T, rows, out_, in_, A(1), x, params[0], A(0), pre);
    detail::add_row_vector<T>(pre, params[1], rows, out_);
    detail::gelu_forward<T>(pre, y);
  }
}

template <class T>
void Linear<T>::backward(Kokkos::View<const T*> dy, const ConstViews& params,
                         const GradViews& grads, Kokkos::View<T*> dx) {
  detail::check_backward<T>(*this, saved_, shape_, dy, params, grads, dx);
  const std::int64_t rows = shape_.rows();
  using A = accum_t<T>;
  const GradWrite w = this->take_grad_write();
  if constexpr (std::is_same_v<T, bfloat16_t>) {
    if (fp8_forward_) {
      // The bias gradient comes from the cast of dy (the same read).
      fp8_->backward(dy, x_, rows, in_, out_, params[0], grads[0].data(),
                     bias_ ? grads[1] : Kokkos::View<float*>(), dx.data(), w, fp8_input_);
      return;
    }
  }
  // dW[out, in] += dy^T[out, rows] x[rows, in]   (accumulated in f32 for 16-bit T;
  // beta 0 when assigning: the old gradient is not read)
  // first: after it nothing reads the saved input, so dx may be its memory
  // (LayerNormMLP writes fc2's dx over the recomputed GELU output).
  gemm<T>(Trans::T, Trans::N, out_, in_, rows, A(1), dy, x_,
          w == GradWrite::assign ? A(0) : A(1), grads[0]);
  if (bias_) detail::accumulate_column_sums<T>(dy, rows, out_, grads[1], ones_, w);
  // dx[rows, in] = dy[rows, out] W[out, in]
  gemm<T>(Trans::N, Trans::N, rows, in_, out_, A(1), dy, params[0], A(0), dx);
}

template <class T>
void Linear<T>::backward_through_gelu(Kokkos::View<T*> dg, Kokkos::View<const T*> pre,
                                      const ConstViews& params, const GradViews& grads,
                                      Kokkos::View<T*> dx) {
  detail::check_backward<T>(*this, saved_, shape_, dg, params, grads, dx);
  if (pre.extent(0) != dg.extent(0))
    throw Error("Linear::backward_through_gelu with a pre-activation of " +
                    std::to_string(pre.extent(0)) + " elements",
                "the output gradient's " + std::to_string(dg.extent(0)) + " elements");
  if constexpr (std::is_same_v<T, bfloat16_t>) {
    if (fp8_forward_) {
      fp8_->backward(dg, x_, shape_.rows(), in_, out_, params[0], grads[0].data(),
                     bias_ ? grads[1] : Kokkos::View<float*>(), dx.data(),
                     this->take_grad_write(), fp8_input_, pre);
      return;
    }
  }
  detail::gelu_backward<T>(pre, dg, dg);  // elementwise, so in place is safe
  backward(dg, params, grads, dx);
}

template <class T>
void Linear<T>::rebind_input(Kokkos::View<const T*> x) {
  if (!saved_ || x.extent(0) != x_.extent(0))
    throw Error("Linear::rebind_input with " + std::to_string(x.extent(0)) + " elements" +
                    (saved_ ? "" : " before forward"),
                "a forward first, then an input of the forward input's size (" +
                    std::to_string(x_.extent(0)) + ")");
  x_ = x;
}

template <class T>
void Linear<T>::release() {
  x_ = {};
  saved_ = false;
  fp8_forward_ = false;
  fp8_input_ = Fp8Input::x;
}

#define KSHARD_LINEAR_INSTANTIATE(T) template class Linear<T>;
KSHARD_FOR_EACH_COMPUTE_TYPE(KSHARD_LINEAR_INSTANTIATE)
#undef KSHARD_LINEAR_INSTANTIATE

}  // namespace kshard

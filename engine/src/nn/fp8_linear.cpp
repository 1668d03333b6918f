#include "fp8_linear.hpp"

#include "kshard/engine/nn/layer.hpp"

namespace kshard::detail {
namespace {

template <class Fp8>
Scratch<Fp8> fp8_scratch(std::int64_t n, const char* label) {
  return scratch<Fp8>(n, label);
}

template <class T>
Kokkos::View<T*> as_view(const Scratch<T>& s) {
  return Kokkos::View<T*>(s.view.data(), s.view.extent(0));
}

}  // namespace

Fp8Linear::Fp8Linear(Fp8Policy policy)
    : policy_(policy), sx_("kshard::Fp8Linear::x", Fp8Format::e4m3),
      sw_("kshard::Fp8Linear::w", Fp8Format::e4m3), sdy_("kshard::Fp8Linear::dy", Fp8Format::e5m2) {}

Fp8ScaleFrom Fp8Linear::prepare(Kokkos::View<const bfloat16_t*> t, Fp8Scale& s) {
  if (policy_.scaling == Fp8Scaling::delayed && s.calibrated()) return Fp8ScaleFrom::scale;
  fp8_amax(t, s);
  return Fp8ScaleFrom::amax;
}

bool Fp8Linear::fits(std::int64_t rows, std::int64_t in, std::int64_t out) noexcept {
  return fp8_gemm_supported(rows, out, in) && fp8_gemm_supported(rows, in, out) &&
         fp8_gemm_supported(out, in, rows);
}

void Fp8Linear::forward(Kokkos::View<const bfloat16_t*> x, std::int64_t rows, std::int64_t in,
                        std::int64_t out, Kokkos::View<const bfloat16_t*> w,
                        const bfloat16_t* bias, Fp8Epilogue e, bfloat16_t* y, bfloat16_t* pre) {
  using E4 = float8_e4m3_t;
  auto xq = fp8_scratch<E4>(rows * in, "kshard::Fp8Linear::xq");
  auto wq = fp8_scratch<E4>(out * in, "kshard::Fp8Linear::wq");
  fp8_cast(x, rows, in, sx_, prepare(x, sx_), as_view(xq), {});
  fp8_cast(w, out, in, sw_, prepare(w, sw_), as_view(wq), {});
  Fp8GemmOptions o;
  o.epilogue = e;
  o.bias = bias;
  o.pre = pre;
  o.fast_accum = true;  // TE's forward setting (its backward GEMMs accumulate exactly)
  fp8_gemm_tn(rows, out, in, {xq.view.data(), Fp8Format::e4m3, sx_.scale_inv()},
              {wq.view.data(), Fp8Format::e4m3, sw_.scale_inv()}, y, o);
}

void Fp8Linear::backward(Kokkos::View<const bfloat16_t*> dy, Kokkos::View<const bfloat16_t*> x,
                         std::int64_t rows, std::int64_t in, std::int64_t out,
                         Kokkos::View<const bfloat16_t*> w, float* dw, Kokkos::View<float*> db,
                         bfloat16_t* dx) {
  using E4 = float8_e4m3_t;
  using E5 = float8_e5m2_t;
  auto dyq = fp8_scratch<E5>(rows * out, "kshard::Fp8Linear::dyq");
  auto dyqt = fp8_scratch<E5>(rows * out, "kshard::Fp8Linear::dyqt");
  auto xqt = fp8_scratch<E4>(rows * in, "kshard::Fp8Linear::xqt");
  auto wqt = fp8_scratch<E4>(out * in, "kshard::Fp8Linear::wqt");
  const Fp8ScaleFrom from_dy = prepare(dy, sdy_);
  if (db.extent(0) != 0) {
    auto partials = scratch<float>(fp8_column_sum_partials(rows, out), "kshard::Fp8Linear::dbias");
    fp8_cast_dbias(dy, rows, out, sdy_, from_dy, as_view(dyq), as_view(dyqt), db, as_view(partials));
  } else {
    fp8_cast(dy, rows, out, sdy_, from_dy, as_view(dyq), as_view(dyqt));
  }
  // The forward's scales: x and W hold the forward's values, so their amax is
  // unchanged (and the cast only folds the same amax in again).
  fp8_cast(x, rows, in, sx_, Fp8ScaleFrom::scale, {}, as_view(xqt));
  fp8_cast(w, out, in, sw_, Fp8ScaleFrom::scale, {}, as_view(wqt));
  Fp8GemmOptions wgrad;
  wgrad.beta = 1.0f;
  // dW[out, in] += dy^T[out, rows] . x^T[in, rows]^T
  fp8_gemm_tn(out, in, rows, {dyqt.view.data(), Fp8Format::e5m2, sdy_.scale_inv()},
              {xqt.view.data(), Fp8Format::e4m3, sx_.scale_inv()}, dw, wgrad);
  // dx[rows, in] = dy[rows, out] . W^T[in, out]^T
  fp8_gemm_tn(rows, in, out, {dyq.view.data(), Fp8Format::e5m2, sdy_.scale_inv()},
              {wqt.view.data(), Fp8Format::e4m3, sw_.scale_inv()}, dx);
}

}  // namespace kshard::detail

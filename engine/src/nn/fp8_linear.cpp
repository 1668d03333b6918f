#include "fp8_linear.hpp"

#include "kshard/kernels/fp8_blockwise.hpp"
#include "kshard/engine/nn/layer.hpp"

namespace kshard::detail {
namespace {

template <class T>
Kokkos::View<T*> as_view(const Scratch<T>& s) {
  return Kokkos::View<T*>(s.view.data(), s.view.extent(0));
}

}  // namespace

Fp8Linear::Fp8Linear(Fp8Policy policy)
    : policy_(policy), sx_("kshard::Fp8Linear::x", Fp8Format::e4m3),
      sw_("kshard::Fp8Linear::w", Fp8Format::e4m3), sdy_("kshard::Fp8Linear::dy", Fp8Format::e5m2) {}

Fp8ScaleFrom Fp8Linear::prepare(Kokkos::View<const bfloat16_t*> t, Fp8Scale& s, Fp8Input input,
                                Kokkos::View<const bfloat16_t*> pre) {
  if (policy_.scaling == Fp8Scaling::delayed && s.calibrated()) return Fp8ScaleFrom::scale;
  fp8_amax(t, s, input, pre);
  return Fp8ScaleFrom::amax;
}

bool Fp8Linear::fits(std::int64_t rows, std::int64_t in, std::int64_t out) const noexcept {
  if (policy_.scaling == Fp8Scaling::block)
    return fp8_blockwise_supported(rows, in) && fp8_blockwise_supported(out, in);
  return fp8_gemm_supported(rows, out, in) && fp8_gemm_supported(rows, in, out) &&
         fp8_gemm_supported(out, in, rows);
}

void Fp8Linear::forward(Kokkos::View<const bfloat16_t*> x, std::int64_t rows, std::int64_t in,
                        std::int64_t out, Kokkos::View<const bfloat16_t*> w,
                        const bfloat16_t* bias, Fp8Epilogue e, bfloat16_t* y, bfloat16_t* pre,
                        Fp8Input input) {
  using E4 = float8_e4m3_t;
  Fp8GemmOptions o;
  o.epilogue = e;
  o.bias = bias;
  o.pre = pre;
  if (policy_.scaling == Fp8Scaling::block) return forward_blocks(x, rows, in, out, w, o, y, input);
  auto xq = scratch<E4>(rows * in, "kshard::Fp8Linear::xq");
  auto wq = scratch<E4>(out * in, "kshard::Fp8Linear::wq");
  fp8_cast(x, rows, in, sx_, prepare(x, sx_, input), as_view(xq), {}, input);
  fp8_cast(w, out, in, sw_, prepare(w, sw_), as_view(wq), {});
  o.fast_accum = true;  // TE's forward setting (its backward GEMMs accumulate exactly)
  fp8_gemm_tn(rows, out, in, {xq.view.data(), Fp8Format::e4m3, sx_.scale_inv()},
              {wq.view.data(), Fp8Format::e4m3, sw_.scale_inv()}, y, o);
}

void Fp8Linear::backward(Kokkos::View<const bfloat16_t*> dy, Kokkos::View<const bfloat16_t*> x,
                         std::int64_t rows, std::int64_t in, std::int64_t out,
                         Kokkos::View<const bfloat16_t*> w, float* dw, Kokkos::View<float*> db,
                         bfloat16_t* dx, GradWrite write, Fp8Input input,
                         Kokkos::View<const bfloat16_t*> gelu_pre) {
  if (policy_.scaling == Fp8Scaling::block)
    return backward_blocks(dy, x, rows, in, out, w, dw, db, dx, write, input, gelu_pre);
  const bool assign = write == GradWrite::assign;
  using E4 = float8_e4m3_t;
  using E5 = float8_e5m2_t;
  auto dyq = scratch<E5>(rows * out, "kshard::Fp8Linear::dyq");
  auto dyqt = scratch<E5>(rows * out, "kshard::Fp8Linear::dyqt");
  auto xqt = scratch<E4>(rows * in, "kshard::Fp8Linear::xqt");
  auto wqt = scratch<E4>(out * in, "kshard::Fp8Linear::wqt");
  const Fp8Input dy_in = gelu_pre.extent(0) ? Fp8Input::gelu_grad : Fp8Input::x;
  const Fp8ScaleFrom from_dy = prepare(dy, sdy_, dy_in, gelu_pre);
  if (db.extent(0) != 0) {
    auto partials = scratch<float>(fp8_column_sum_partials(rows, out), "kshard::Fp8Linear::dbias");
    fp8_cast_dbias(dy, rows, out, sdy_, from_dy, as_view(dyq), as_view(dyqt), db, as_view(partials),
                   dy_in, gelu_pre, assign);
  } else {
    fp8_cast(dy, rows, out, sdy_, from_dy, as_view(dyq), as_view(dyqt), dy_in, gelu_pre);
  }
  // The forward's scales: x and W hold the forward's values, so their amax is
  // unchanged (and the cast only folds the same amax in again).
  fp8_cast(x, rows, in, sx_, Fp8ScaleFrom::scale, {}, as_view(xqt), input);
  fp8_cast(w, out, in, sw_, Fp8ScaleFrom::scale, {}, as_view(wqt));
  Fp8GemmOptions wgrad;
  wgrad.beta = assign ? 0.0f : 1.0f;
  // dW[out, in] += dy^T[out, rows] . x^T[in, rows]^T
  fp8_gemm_tn(out, in, rows, {dyqt.view.data(), Fp8Format::e5m2, sdy_.scale_inv()},
              {xqt.view.data(), Fp8Format::e4m3, sx_.scale_inv()}, dw, wgrad);
  // dx[rows, in] = dy[rows, out] . W^T[in, out]^T
  fp8_gemm_tn(rows, in, out, {dyq.view.data(), Fp8Format::e5m2, sdy_.scale_inv()},
              {wqt.view.data(), Fp8Format::e4m3, sw_.scale_inv()}, dx);
}

void Fp8Linear::forward_blocks(Kokkos::View<const bfloat16_t*> x, std::int64_t rows,
                               std::int64_t in, std::int64_t out,
                               Kokkos::View<const bfloat16_t*> w, Fp8GemmOptions o, bfloat16_t* y,
                               Fp8Input input) {
  using E4 = float8_e4m3_t;
  auto xq = scratch<E4>(rows * in, "kshard::Fp8Linear::xq");
  auto xs = scratch<float>(fp8_scales_1x128(rows, in), "kshard::Fp8Linear::xs");
  auto wq = scratch<E4>(out * in, "kshard::Fp8Linear::wq");
  auto ws = scratch<float>(fp8_scales_128x128(out, in), "kshard::Fp8Linear::ws");
  fp8_cast_1x128(x, rows, in, as_view(xq), as_view(xs), {}, {}, {}, {}, input);
  fp8_cast_128x128(w, out, in, as_view(wq), as_view(ws), {}, {});
  fp8_gemm_tn(rows, out, in,
              {xq.view.data(), Fp8Format::e4m3, xs.view.data(), Fp8ScaleMode::block_1x128},
              {wq.view.data(), Fp8Format::e4m3, ws.view.data(), Fp8ScaleMode::block_128x128}, y, o);
}

void Fp8Linear::backward_blocks(Kokkos::View<const bfloat16_t*> dy,
                                Kokkos::View<const bfloat16_t*> x, std::int64_t rows,
                                std::int64_t in, std::int64_t out,
                                Kokkos::View<const bfloat16_t*> w, float* dw,
                                Kokkos::View<float*> db, bfloat16_t* dx, GradWrite write,
                                Fp8Input input, Kokkos::View<const bfloat16_t*> gelu_pre) {
  const bool assign = write == GradWrite::assign;
  using E4 = float8_e4m3_t;
  constexpr Fp8ScaleMode v128 = Fp8ScaleMode::block_1x128;
  // dy [rows, out] for dgrad (blocks along out) and dy^T [out, rows] for
  // wgrad (blocks along rows), with the bias gradient, in one kernel.
  auto dyq = scratch<E4>(rows * out, "kshard::Fp8Linear::dyq");
  auto dys = scratch<float>(fp8_scales_1x128(rows, out), "kshard::Fp8Linear::dys");
  auto dyqt = scratch<E4>(rows * out, "kshard::Fp8Linear::dyqt");
  auto dyts = scratch<float>(fp8_scales_1x128(out, rows), "kshard::Fp8Linear::dyts");
  {
    auto partials = scratch<float>(db.extent(0) ? rows / kFp8Block * out : 0,
                                   "kshard::Fp8Linear::dbias");
    fp8_cast_1x128(dy, rows, out, as_view(dyq), as_view(dys), as_view(dyqt), as_view(dyts), db,
                   as_view(partials), gelu_pre.extent(0) ? Fp8Input::gelu_grad : Fp8Input::x,
                   gelu_pre, assign);
  }
  auto xqt = scratch<E4>(rows * in, "kshard::Fp8Linear::xqt");
  auto xts = scratch<float>(fp8_scales_1x128(in, rows), "kshard::Fp8Linear::xts");
  fp8_cast_1x128(x, rows, in, {}, {}, as_view(xqt), as_view(xts), {}, {}, input);
  // W^T [in, out]: W's 128x128 tiles transposed, the same scales.
  auto wqt = scratch<E4>(out * in, "kshard::Fp8Linear::wqt");
  auto wts = scratch<float>(fp8_scales_128x128(in, out), "kshard::Fp8Linear::wts");
  fp8_cast_128x128(w, out, in, {}, {}, as_view(wqt), as_view(wts));
  Fp8GemmOptions wgrad;
  wgrad.beta = assign ? 0.0f : 1.0f;
  fp8_gemm_tn(out, in, rows, {dyqt.view.data(), Fp8Format::e4m3, dyts.view.data(), v128},
              {xqt.view.data(), Fp8Format::e4m3, xts.view.data(), v128}, dw, wgrad);
  fp8_gemm_tn(rows, in, out, {dyq.view.data(), Fp8Format::e4m3, dys.view.data(), v128},
              {wqt.view.data(), Fp8Format::e4m3, wts.view.data(), Fp8ScaleMode::block_128x128},
              dx);
}

}  // namespace kshard::detail

// Fused causal attention (flash_attention_forward/backward) against the
// unfused reference (detail::causal_attention_forward/backward in double) on
// the same inputs: for the 16-bit types the reference gets the inputs already
// rounded to that type, so only the kernel's own arithmetic is measured.
//
// Errors are max |fused - ref| / max |ref| per output (ctx, lse and each of the
// dq, dk, dv parts), over sequence lengths on and off the tile size (the
// portable kernel's host tiles are 64, the tensor-core tiles 64 and 32),
// heads 1..16, head dims 8..128 (64 and 128 take the tensor-core path for the
// 16-bit types and the exact-f32 SIMT kernel for float on the GPU build; the
// float cases also run through the portable kernel there), batch 1 to 3, and
// score amplitudes up to |s| ~ 12 (peaked softmax rows, where a wrong running
// max or rescale shows).
//
// Tolerances (measured maxima over all cases and outputs in brackets):
//  double 1e-12: the fused kernel sums in another order; every sum has <= 200
//    terms of O(1), so differences are ~1e-14. [host: 3.5e-15]
//  float 2e-5: the reference is double, so this is float's own error: u = 6e-8
//    times the condition of the softmax and of sums of <= 200 terms.
//    [host: 1.5e-6; the f32 CUDA kernel under tests/layers/flash_cuda_emulation:
//    1.3e-6]
//  bfloat16 1.5e-2, float16 3e-3: inputs and outputs are 16-bit, so every
//    output carries one rounding (2^-9 = 2e-3 relative to the element for
//    bf16, 2^-12 = 2.4e-4 for f16), and O (rounded) enters
//    delta = rowsum(dO * O); on tensor cores P and dS are also rounded to 16
//    bits before their products (as in every FlashAttention), a few roundings
//    more per sum. [host, portable kernel, f32 inside: bf16 5.8e-3 (dk at
//    amplitude 3), f16 5.1e-4; the tensor-core kernels run on the host under
//    tests/layers/flash_cuda_emulation: bf16 4.0e-3, f16 5.1e-4; cuDNN 9.19 on
//    the H200: bf16 5.1e-3, f16 7.8e-4]. A dropped
//    rescale, a wrong mask or a mis-indexed tile gives >= 5e-2 (a dropped
//    online-softmax rescale: 2.6).
//
// Every output element is poisoned with NaN first and must come back finite.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>

#include "kshard/compat/kokkos.hpp"
#include "kshard/engine/nn/attention.hpp"
#include "kshard/kernels/flash_attention.hpp"
#include "kshard/error.hpp"
#include "layer_test_util.hpp"

using namespace kshard;
using namespace kshard::test;

namespace {

struct Case {
  std::int64_t batch, seq, heads, hd;
  double amp;  // inputs uniform in [-amp, amp]
};

std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << "batch " << c.batch << " seq " << c.seq << " heads " << c.heads << " hd " << c.hd
            << " amp " << c.amp;
}

// seq: 1 (a single key), 7, 33, 64 (one tile of the host and GPU kernels),
// 65, 100, 129 and 130 (a partial last tile), 200 (several tiles, partial
// last one); head dims 64 and 128 (the GPU kernels') at most of them.
const Case kCases[] = {
    {1, 1, 1, 8, 1.0},      {2, 7, 3, 16, 1.0},     {1, 64, 2, 64, 1.0},
    {3, 65, 4, 32, 1.0},    {1, 130, 16, 8, 1.0},   {2, 130, 2, 128, 1.0},
    {1, 65, 16, 64, 2.0},   {1, 200, 1, 128, 1.0},  {2, 100, 4, 64, 3.0},
    {1, 33, 1, 128, 3.0},   {1, 1, 1, 64, 1.0},     {2, 1, 2, 128, 1.0},
    {2, 33, 3, 64, 1.0},    {3, 64, 1, 128, 2.0},   {1, 65, 5, 128, 1.0},
    {2, 129, 2, 64, 3.0},   {1, 129, 16, 128, 1.0}, {2, 200, 2, 64, 2.0},
    {1, 100, 8, 128, 3.0},
};

template <class T>
double tolerance();
template <>
double tolerance<double>() { return 1e-12; }
template <>
double tolerance<float>() { return 2e-5; }
template <>
double tolerance<bfloat16_t>() { return 1.5e-2; }
template <>
double tolerance<float16_t>() { return 3e-3; }

template <class T>
Kokkos::View<T*> poisoned(std::size_t n, const char* label) {
  Kokkos::View<T*> d(std::string(label), n);
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < n; ++i) h(i) = from_double<T>(std::numeric_limits<double>::quiet_NaN());
  Kokkos::deep_copy(d, h);
  return d;
}

std::size_t count_nonfinite(const HostVec& v) {
  std::size_t n = 0;
  for (double x : v) n += std::isfinite(x) ? 0 : 1;
  return n;
}

/// Columns [c0, c0+w) of every row of a row-major [rows, ld] matrix.
HostVec columns(const HostVec& m, std::int64_t ld, std::int64_t c0, std::int64_t w) {
  const std::int64_t rows = static_cast<std::int64_t>(m.size()) / ld;
  HostVec out;
  out.reserve(static_cast<std::size_t>(rows * w));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < w; ++c) out.push_back(m[r * ld + c0 + c]);
  return out;
}

struct Reference {
  HostVec ctx, lse, dqkv;
};

// The unfused kernels in double, plus lse computed directly on the host.
Reference reference(const Case& c, const HostVec& qkv, const HostVec& dctx) {
  const std::int64_t d = c.heads * c.hd, rows = c.batch * c.seq;
  auto qkv_d = to_device<double>(qkv, "qkv");
  Kokkos::View<double*> prob("prob", c.batch * c.heads * c.seq * c.seq);
  Kokkos::View<double*> dprob("dprob", prob.extent(0));
  Kokkos::View<double*> ctx("ctx", rows * d), dqkv("dqkv", rows * 3 * d);
  detail::causal_attention_forward<double>(qkv_d, prob, ctx, c.batch, c.seq, d, c.heads);
  detail::causal_attention_backward<double>(qkv_d, prob, to_device<double>(dctx, "dctx"), dprob,
                                            dqkv, c.batch, c.seq, d, c.heads);
  Reference r{to_host(ctx), HostVec(static_cast<std::size_t>(c.batch * c.heads * c.seq)),
              to_host(dqkv)};
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.hd));
  HostVec s(static_cast<std::size_t>(c.seq));
  for (std::int64_t b = 0; b < c.batch; ++b)
    for (std::int64_t h = 0; h < c.heads; ++h)
      for (std::int64_t i = 0; i < c.seq; ++i) {
        const double* q = &qkv[(b * c.seq + i) * 3 * d + h * c.hd];
        double mx = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j <= i; ++j) {
          const double* k = &qkv[(b * c.seq + j) * 3 * d + d + h * c.hd];
          double dotp = 0;
          for (std::int64_t e = 0; e < c.hd; ++e) dotp += q[e] * k[e];
          s[j] = scale * dotp;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (std::int64_t j = 0; j <= i; ++j) sum += std::exp(s[j] - mx);
        r.lse[(b * c.heads + h) * c.seq + i] = mx + std::log(sum);
      }
  return r;
}

struct Errors {
  double ctx = 0, lse = 0, dq = 0, dk = 0, dv = 0;
  double max() const { return std::max({ctx, lse, dq, dk, dv}); }
};

// api: the backend's choice (on CUDA builds with cuDNN: cuDNN's fused
// attention for the 16-bit types). Where that is cuDNN, also own_kernel
// (kshard's tensor-core / portable kernels, vendor library switched off) and
// mixed (cuDNN forward, own backward: the two agree on what lse means).
enum class Path { api, own_kernel, mixed, portable };

const char* path_name(Path p) {
  switch (p) {
    case Path::api: return " (backend)";
    case Path::own_kernel: return " (own kernel)";
    case Path::mixed: return " (cuDNN forward, own backward)";
    case Path::portable: return " (portable)";
  }
  return "";
}

// Restores the vendor-library switch on scope exit.
struct VendorAttention {
  bool saved = detail::vendor_attention_enabled();
  explicit VendorAttention(bool on) { detail::set_vendor_attention_enabled(on); }
  ~VendorAttention() { detail::set_vendor_attention_enabled(saved); }
  VendorAttention(const VendorAttention&) = delete;
  VendorAttention& operator=(const VendorAttention&) = delete;
};

template <class T>
std::string backend_path(const Case& c) {
  detail::FlashArgs<T> a;
  a.batch = c.batch;
  a.seq = c.seq;
  a.d = c.heads * c.hd;
  a.heads = c.heads;
  return detail::flash_attention_path(a);
}

// Runs the fused kernels of T on (qkv, dctx) through `path`, checks that every
// output element was written and returns the errors against `ref`.
template <class T>
Errors run_fused(const Case& c, const HostVec& qkv, const HostVec& dctx, const Reference& ref,
                 Path path) {
  using A = accum_t<T>;
  const std::int64_t d = c.heads * c.hd, rows = c.batch * c.seq;
  const std::int64_t nrows = flash_attention_rows(c.batch, c.seq, c.heads);
  auto qkv_t = to_device<T>(qkv, "qkv");
  auto dctx_t = to_device<T>(dctx, "dctx");
  auto ctx = poisoned<T>(static_cast<std::size_t>(rows * d), "ctx");
  auto dqkv = poisoned<T>(static_cast<std::size_t>(rows * 3 * d), "dqkv");
  auto lse = poisoned<A>(static_cast<std::size_t>(nrows), "lse");
  auto delta = poisoned<A>(static_cast<std::size_t>(nrows), "delta");
  if (path != Path::portable) {
    {
      VendorAttention vendor(path != Path::own_kernel);
      flash_attention_forward<T>(qkv_t, ctx, lse, c.batch, c.seq, d, c.heads);
    }
    VendorAttention vendor(path == Path::api);
    flash_attention_backward<T>(qkv_t, ctx, dctx_t, lse, dqkv, c.batch, c.seq, d, c.heads,
                                delta);
  } else {
    detail::FlashArgs<T> a;
    a.batch = c.batch;
    a.seq = c.seq;
    a.d = d;
    a.heads = c.heads;
    a.qkv = qkv_t.data();
    a.out = ctx.data();
    a.lse = lse.data();
    detail::flash_attention_forward_portable<T>(a);
    a.ctx = ctx.data();
    a.dctx = dctx_t.data();
    a.lse_in = lse.data();
    a.delta = delta.data();
    a.out = dqkv.data();
    detail::flash_attention_backward_portable<T>(a);
  }
  Kokkos::fence();
  const HostVec ctx_h = to_host(ctx), lse_h = to_host(lse), dqkv_h = to_host(dqkv);
  BOOST_TEST(count_nonfinite(ctx_h) == 0u);
  BOOST_TEST(count_nonfinite(lse_h) == 0u);
  BOOST_TEST(count_nonfinite(dqkv_h) == 0u);
  Errors e;
  e.ctx = rel_err(ctx_h, ref.ctx);
  e.lse = rel_err(lse_h, ref.lse, 1.0);  // lse is O(log seq): absolute below 1
  e.dq = rel_err(columns(dqkv_h, 3 * d, 0, d), columns(ref.dqkv, 3 * d, 0, d));
  e.dk = rel_err(columns(dqkv_h, 3 * d, d, d), columns(ref.dqkv, 3 * d, d, d));
  e.dv = rel_err(columns(dqkv_h, 3 * d, 2 * d, d), columns(ref.dqkv, 3 * d, 2 * d, d));
  return e;
}

template <class T>
void check_against_reference(const char* type_name) {
  double worst = 0;
  for (const Case& c : kCases) {
    std::mt19937_64 rng(1000 + c.seq * 31 + c.heads * 7 + c.hd);
    const std::int64_t d = c.heads * c.hd, rows = c.batch * c.seq;
    const HostVec qkv = rounded<T>(random_vec(static_cast<std::size_t>(rows * 3 * d), rng,
                                              -c.amp, c.amp));
    const HostVec dctx = rounded<T>(random_vec(static_cast<std::size_t>(rows * d), rng));
    const Reference ref = reference(c, qkv, dctx);
    const std::string backend = backend_path<T>(c);
    for (Path path : {Path::api, Path::own_kernel, Path::mixed, Path::portable}) {
      // CUDA builds run double (and float off head dims 64/128) on the
      // portable kernel: once is enough; float at 64/128 runs on the f32
      // kernel, so the portable one is checked separately.
      const bool host = compat::host_accessible_v<compat::DeviceSpace>;
      if (path == Path::portable && !host && !is_low_precision_v<T> &&
          backend == "portable kernel")
        continue;
      if ((path == Path::own_kernel || path == Path::mixed) && backend != "cuDNN") continue;
      BOOST_TEST_CONTEXT(type_name << " " << c << path_name(path)) {
        const Errors e = run_fused<T>(c, qkv, dctx, ref, path);
        BOOST_TEST_MESSAGE(type_name << " " << c << path_name(path) << " [backend: " << backend
                                     << "]: ctx " << e.ctx << " lse " << e.lse << " dq " << e.dq
                                     << " dk " << e.dk << " dv " << e.dv);
        BOOST_TEST(e.ctx <= tolerance<T>());
        BOOST_TEST(e.lse <= tolerance<T>());
        BOOST_TEST(e.dq <= tolerance<T>());
        BOOST_TEST(e.dk <= tolerance<T>());
        BOOST_TEST(e.dv <= tolerance<T>());
        worst = std::max(worst, e.max());
      }
    }
  }
  BOOST_TEST_MESSAGE(type_name << " fused vs unfused: max error " << worst << " (tolerance "
                               << tolerance<T>() << ")");
}

template <class T>
HostVec backward_bits(const Case& c, const HostVec& qkv, const HostVec& dctx) {
  using A = accum_t<T>;
  const std::int64_t d = c.heads * c.hd, rows = c.batch * c.seq;
  const std::int64_t nrows = flash_attention_rows(c.batch, c.seq, c.heads);
  auto qkv_t = to_device<T>(qkv, "qkv");
  Kokkos::View<T*> ctx("ctx", rows * d), dqkv("dqkv", rows * 3 * d);
  Kokkos::View<A*> lse("lse", nrows), delta("delta", nrows);
  flash_attention_forward<T>(qkv_t, ctx, lse, c.batch, c.seq, d, c.heads);
  flash_attention_backward<T>(qkv_t, ctx, to_device<T>(dctx, "dctx"), lse, dqkv, c.batch, c.seq,
                              d, c.heads, delta);
  return to_host(dqkv);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(flash_attention)

BOOST_AUTO_TEST_CASE(double_vs_unfused) { check_against_reference<double>("double"); }
BOOST_AUTO_TEST_CASE(float_vs_unfused) { check_against_reference<float>("float"); }
BOOST_AUTO_TEST_CASE(bfloat16_vs_unfused) { check_against_reference<bfloat16_t>("bf16"); }
BOOST_AUTO_TEST_CASE(float16_vs_unfused) { check_against_reference<float16_t>("f16"); }

// Two backward runs of T on the same random inputs of case c agree bit for bit.
template <class T>
bool backward_repeats_bitwise(const Case& c, std::mt19937_64& rng) {
  const std::int64_t d = c.heads * c.hd, rows = c.batch * c.seq;
  const HostVec qkv = random_vec(static_cast<std::size_t>(rows * 3 * d), rng);
  const HostVec dctx = random_vec(static_cast<std::size_t>(rows * d), rng);
  const HostVec a = backward_bits<T>(c, qkv, dctx);
  const HostVec b = backward_bits<T>(c, qkv, dctx);
  return std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

// No atomics anywhere: two runs on the same inputs agree bit for bit.
BOOST_AUTO_TEST_CASE(backward_is_deterministic) {
  std::mt19937_64 rng(5);
  BOOST_TEST(backward_repeats_bitwise<bfloat16_t>(Case{2, 130, 4, 64, 1.0}, rng));
  BOOST_TEST(backward_repeats_bitwise<float>(Case{2, 130, 4, 64, 1.0}, rng));
  // Head dim 128 (the f32 CUDA kernel's other instantiation), seq off the tile.
  BOOST_TEST(backward_repeats_bitwise<float>(Case{2, 129, 2, 128, 1.0}, rng));
}

BOOST_AUTO_TEST_CASE(bad_arguments_throw) {
  const std::int64_t batch = 2, seq = 5, d = 8, heads = 2, rows = batch * seq;
  const std::int64_t nrows = flash_attention_rows(batch, seq, heads);
  Kokkos::View<float*> qkv("qkv", rows * 3 * d), ctx("ctx", rows * d), dctx("dctx", rows * d);
  Kokkos::View<float*> dqkv("dqkv", rows * 3 * d), lse("lse", nrows), delta("delta", nrows);
  Kokkos::View<float*> small("small", 3);
  auto fwd = [&](Kokkos::View<float*> q, Kokkos::View<float*> c, Kokkos::View<float*> l,
                 std::int64_t b, std::int64_t s, std::int64_t dd, std::int64_t h) {
    flash_attention_forward<float>(q, c, l, b, s, dd, h);
  };
  auto bwd = [&](Kokkos::View<float*> dq, Kokkos::View<float*> dl) {
    flash_attention_backward<float>(qkv, ctx, dctx, lse, dq, batch, seq, d, heads, dl);
  };
  BOOST_CHECK_NO_THROW(fwd(qkv, ctx, lse, batch, seq, d, heads));
  BOOST_CHECK_NO_THROW(bwd(dqkv, delta));
  BOOST_CHECK_THROW(fwd(qkv, ctx, lse, batch, seq, d, 3), Error);  // 8 % 3 != 0
  BOOST_CHECK_THROW(fwd(qkv, ctx, lse, batch, 0, d, heads), Error);
  BOOST_CHECK_THROW(fwd(qkv, ctx, lse, -1, seq, d, heads), Error);
  BOOST_CHECK_THROW(fwd(small, ctx, lse, batch, seq, d, heads), Error);
  BOOST_CHECK_THROW(fwd(qkv, small, lse, batch, seq, d, heads), Error);
  BOOST_CHECK_THROW(fwd(qkv, ctx, small, batch, seq, d, heads), Error);
  BOOST_CHECK_THROW(bwd(small, delta), Error);
  BOOST_CHECK_THROW(bwd(dqkv, small), Error);
  try {
    fwd(qkv, ctx, small, batch, seq, d, heads);
  } catch (const Error& e) {
    BOOST_TEST(e.problem().find("lse has 3 elements") != std::string::npos);
    BOOST_TEST(e.expected().find("batch*heads*seq = 20") != std::string::npos);
  }
  Kokkos::fence();
}

BOOST_AUTO_TEST_SUITE_END()

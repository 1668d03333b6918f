// chunked_cross_entropy (the LM head + loss in row chunks) against the one-pass
// reference it replaces: head.forward over all rows, cross_entropy_loss with
// the gradient written over the logits, head.backward. Same loss, same counted
// rows (an ignored target among them), same grad_scale; chunk sizes that
// divide the rows, do not, are one row, and exceed the rows.
#include <boost/test/unit_test.hpp>

#include <memory>

#include "kshard/engine/nn/chunked_cross_entropy.hpp"
#include "kshard/engine/nn/layer_norm_linear.hpp"
#include "kshard/engine/nn/linear.hpp"
#include "kshard/engine/nn/loss.hpp"
#include "kshard/engine/nn/transformer_layer.hpp"
#include "kshard/error.hpp"
#include "layer_test_util.hpp"

using namespace kshard;
using namespace kshard::test;

namespace {

constexpr std::int64_t kBatch = 2, kSeq = 5, kRows = kBatch * kSeq, kD = 8, kVocab = 13;
constexpr double kScale = 0.5;

Kokkos::View<std::int32_t*> targets_view(const std::vector<std::int32_t>& t) {
  Kokkos::View<std::int32_t*> d("targets", t.size());
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < t.size(); ++i) h(i) = t[i];
  Kokkos::deep_copy(d, h);
  return d;
}

// Row 3 ignored (-100, PyTorch's ignore_index): no loss, zero gradient, not counted.
std::vector<std::int32_t> targets() {
  std::vector<std::int32_t> t;
  for (std::int64_t r = 0; r < kRows; ++r) t.push_back(std::int32_t((r * 5 + 2) % kVocab));
  t[3] = -100;
  return t;
}

struct Result {
  double loss = 0;
  HostVec dx;
  std::vector<HostVec> grads;
};

template <class T>
Result run(Layer<T>& head, const std::vector<HostVec>& hp, const HostVec& x,
           std::int64_t chunk_rows) {
  const ActShape shape{kBatch, kSeq, kD};
  auto params = params_to_device<T>(hp);
  auto grads = allocate_gradients(head);
  auto xd = to_device<T>(x, "x");
  Kokkos::View<T*> dx("dx", xd.extent(0));
  auto t = targets_view(targets());
  Result r;
  if (chunk_rows == 0) {  // the one-pass reference
    Kokkos::View<T*> logits("logits", std::size_t(kRows * kVocab));
    head.forward(xd, shape, const_views(params), logits);
    r.loss = cross_entropy_loss<T, std::int32_t>(logits, kRows, kVocab, t, logits, kScale);
    head.backward(logits, const_views(params), grads, dx);
    head.release();
  } else {
    Kokkos::View<double*> result("result", 3);
    chunked_cross_entropy_async<T, std::int32_t>(head, xd, shape, const_views(params), grads, t,
                                                 kScale, dx, chunk_rows, result);
    r.loss = cross_entropy_result(result, kRows, kVocab);
  }
  r.dx = to_host(dx);
  for (auto& g : grads) r.grads.push_back(to_host(g));
  return r;
}

// Tolerances: double and float differ only in the order of the parameter
// gradient's sums over rows (chunk by chunk vs one GEMM): ~1e-15 / ~1e-7
// relative, bounded at 1e-12 / 2e-6. bf16: the logits and dx are rounded to
// bf16 (8 bits), and a sum that differs in its last f32 bits can round to the
// neighbouring bf16 value: 1e-2 relative on dx, 1e-4 on the loss and the f32
// parameter gradients.
template <class T>
double tolerance(bool rounded_output) {
  if constexpr (std::is_same_v<T, double>) return 1e-12;
  if constexpr (std::is_same_v<T, float>) return 2e-6;
  return rounded_output ? 1e-2 : 1e-4;
}

template <class T, class Head>
void check_head(const char* name) {
  Head head(kD, kVocab);
  const auto hp = random_params<T>(head, 7);
  std::mt19937_64 rng(11);
  const HostVec x = rounded<T>(random_vec(std::size_t(kRows * kD), rng, -2.0, 2.0));
  const Result ref = run<T>(head, hp, x, 0);
  BOOST_TEST_REQUIRE(std::isfinite(ref.loss));
  for (std::int64_t chunk : {std::int64_t(1), std::int64_t(3), std::int64_t(5), kRows,
                             kRows + 7}) {
    const Result got = run<T>(head, hp, x, chunk);
    BOOST_TEST_CONTEXT(name << " chunk_rows " << chunk) {
      BOOST_TEST(std::abs(got.loss - ref.loss) <= tolerance<T>(false) * std::abs(ref.loss));
      BOOST_TEST(rel_err(got.dx, ref.dx) <= tolerance<T>(true));
      // The ignored row gets no gradient at all.
      for (std::int64_t c = 0; c < kD; ++c) BOOST_TEST(got.dx[std::size_t(3 * kD + c)] == 0.0);
      BOOST_TEST_REQUIRE(got.grads.size() == ref.grads.size());
      for (std::size_t i = 0; i < ref.grads.size(); ++i)
        BOOST_TEST(rel_err(got.grads[i], ref.grads[i]) <= tolerance<T>(false));
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(chunked_cross_entropy_tests)

BOOST_AUTO_TEST_CASE(chunks_equal_one_pass_linear) {
  check_head<double, Linear<double>>("Linear<double>");
  check_head<float, Linear<float>>("Linear<float>");
  check_head<bfloat16_t, Linear<bfloat16_t>>("Linear<bf16>");
}

BOOST_AUTO_TEST_CASE(chunks_equal_one_pass_layer_norm_linear) {
  check_head<double, LayerNormLinear<double>>("LayerNormLinear<double>");
  check_head<float, LayerNormLinear<float>>("LayerNormLinear<float>");
}

BOOST_AUTO_TEST_CASE(rows_per_chunk_from_bytes) {
  // 13 classes of 8 bytes = 104 B per row.
  BOOST_TEST(loss_chunk_rows(1000, 10, 13, 8) == 5);  // 9 fit: two chunks of 5
  BOOST_TEST(loss_chunk_rows(104, 10, 13, 8) == 1);
  BOOST_TEST(loss_chunk_rows(1, 10, 13, 8) == 1);         // at least one row
  BOOST_TEST(loss_chunk_rows(1 << 30, 10, 13, 8) == 10);  // at most all rows
  // The large benchmark model, 4096 rows x 32000 classes, 128 MiB chunks: bf16
  // in two chunks, f32 in four.
  BOOST_TEST(loss_chunk_rows(std::size_t(128) << 20, 4096, 32000, 2) == 2048);
  BOOST_TEST(loss_chunk_rows(std::size_t(128) << 20, 4096, 32000, 4) == 1024);
  // FsdpOptions' default, 256 MiB: bf16 in one chunk, f32 in two.
  BOOST_TEST(loss_chunk_rows(std::size_t(256) << 20, 4096, 32000, 2) == 4096);
  BOOST_TEST(loss_chunk_rows(std::size_t(256) << 20, 4096, 32000, 4) == 2048);
}

BOOST_AUTO_TEST_CASE(chunked_cross_entropy_rejects_bad_arguments) {
  const ActShape shape{kBatch, kSeq, kD};
  Linear<double> head(kD, kVocab);
  auto params = params_to_device<double>(random_params<double>(head, 3));
  auto grads = allocate_gradients(head);
  std::mt19937_64 rng(5);
  auto x = to_device<double>(random_vec(std::size_t(kRows * kD), rng), "x");
  Kokkos::View<double*> dx("dx", x.extent(0)), result("result", 3);
  auto t = targets_view(targets());
  auto call = [&](Layer<double>& h, Kokkos::View<double*> d, std::int64_t chunk,
                  Kokkos::View<std::int32_t*> tg) {
    chunked_cross_entropy_async<double, std::int32_t>(h, x, shape, const_views(params), grads,
                                                      tg, 1.0, d, chunk, result);
  };
  BOOST_CHECK_THROW(call(head, dx, 0, t), Error);  // no rows per chunk
  BOOST_CHECK_THROW(call(head, Kokkos::View<double*>("short", 5), 4, t), Error);
  BOOST_CHECK_THROW(call(head, dx, 4, Kokkos::View<std::int32_t*>("few", 3)), Error);
  // A head that mixes rows (attention) cannot run in chunks.
  TransformerLayer<double> mixer(kD, 2, 2 * kD);
  BOOST_CHECK_THROW(call(mixer, dx, 4, t), Error);
  // A target >= vocab: the loss is still computed, reading it reports the bad target.
  auto bad = targets();
  bad[7] = std::int32_t(kVocab);
  call(head, dx, 4, targets_view(bad));
  BOOST_CHECK_THROW(cross_entropy_result(result, kRows, kVocab), Error);
}

BOOST_AUTO_TEST_SUITE_END()

// Backward of every layer against central finite differences, in double.
//
// Scalar objective: L(x, params) = sum_i y_i * r_i with a fixed random r, so
// dL/dy = r and backward(dy = r) must give dL/dx and dL/dparams.
// Central differences with step h = 1e-6 have truncation error ~ h^2 |L'''| / 6
// ~ 1e-13 and rounding error ~ eps * |L| / h ~ 2e-16 * O(1) / 1e-6 ~ 1e-9.
// Errors are measured relative to the gradient's scale,
// max_i |fd_i - an_i| / max(max_i |an_i|, 1e-2), and must be <= 1e-6:
// three orders of magnitude above the FD noise, far below any real bug
// (a wrong term gives errors of order 1e-1 .. 1).
//
// KSHARD_FD_COORDS=N probes at most N evenly spaced coordinates per tensor
// (always the first and the last). ci/gpu-run sanitize sets it: under
// racecheck every forward costs seconds, and probing more coordinates of one
// tensor runs the same kernels at the same shapes again; the unsanitized
// runs probe every coordinate.
#include <boost/test/unit_test.hpp>

#include <cstdlib>
#include <functional>
#include <string>

#include "kshard/engine/nn/attention.hpp"
#include "kshard/engine/nn/embedding.hpp"
#include "kshard/engine/nn/gelu.hpp"
#include "kshard/engine/nn/layer_norm.hpp"
#include "kshard/engine/nn/layer_norm_linear.hpp"
#include "kshard/engine/nn/layer_norm_mlp.hpp"
#include "kshard/engine/nn/linear.hpp"
#include "kshard/engine/nn/llama_layer.hpp"
#include "kshard/engine/nn/rms_norm.hpp"
#include "kshard/engine/nn/swiglu.hpp"
#include "kshard/engine/nn/swiglu_mlp.hpp"
#include "kshard/engine/nn/transformer_layer.hpp"
#include "layer_test_util.hpp"

using namespace kshard;
using namespace kshard::test;

namespace {


double objective(Layer<double>& layer, const HostVec& x, ActShape shape,
                 const std::vector<HostVec>& hp, const HostVec& r) {
  return dot(run_forward(layer, x, shape, params_to_device<double>(hp)), r);
}

// The coordinates of a tensor of n values that finite differences probe.
std::vector<std::size_t> probed_coordinates(std::size_t n) {
  std::size_t limit = n;
  if (const char* e = std::getenv("KSHARD_FD_COORDS")) limit = std::stoul(e);
  std::vector<std::size_t> idx;
  if (limit >= n || n < 2) {
    for (std::size_t i = 0; i < n; ++i) idx.push_back(i);
    return idx;
  }
  limit = std::max<std::size_t>(limit, 2);
  for (std::size_t k = 0; k < limit; ++k) idx.push_back(k * (n - 1) / (limit - 1));
  return idx;
}

// Central differences of f at the probed coordinates of v, beside the
// analytic gradient's values there (both as HostVecs of the same length).
struct Probed {
  HostVec fd, an;
};

Probed finite_difference(const std::function<double()>& f, HostVec& v, const HostVec& an) {
  Probed out;
  for (std::size_t i : probed_coordinates(v.size())) {
    const double keep = v[i];
    v[i] = keep + kFdStep;
    const double fp = f();
    v[i] = keep - kFdStep;
    const double fm = f();
    v[i] = keep;
    out.fd.push_back((fp - fm) / (2 * kFdStep));
    out.an.push_back(an[i]);
  }
  return out;
}

// rel_err of the probed values, relative to the whole analytic gradient's scale.
double probed_error(const Probed& p, const HostVec& an) {
  double m = 0;
  for (std::size_t i = 0; i < p.fd.size(); ++i) m = std::max(m, std::abs(p.fd[i] - p.an[i]));
  return m / std::max(max_abs(an), 1e-2);
}

// x: input values; x_has_grad: false for token ids (dx must then be zeros).
void check_gradients(Layer<double>& layer, ActShape shape, HostVec x, bool x_has_grad = true,
                     std::uint64_t seed = 11) {
  std::mt19937_64 rng(seed);
  auto hp = random_params(layer, seed);
  const HostVec r = random_vec(static_cast<std::size_t>(shape.rows() * layer.out_features()), rng);
  const Gradients an = run_backward(layer, x, shape, params_to_device<double>(hp), r);
  auto f = [&]() { return objective(layer, x, shape, hp, r); };

  const auto specs = layer.param_specs();
  BOOST_REQUIRE_EQUAL(an.params.size(), specs.size());
  for (std::size_t p = 0; p < specs.size(); ++p) {
    const double err = probed_error(finite_difference(f, hp[p], an.params[p]), an.params[p]);
    BOOST_TEST_MESSAGE(layer.kind() << " d/d" << specs[p].name << " fd error " << err);
    BOOST_TEST_INFO(layer.kind() << " d/d" << specs[p].name << " (scale "
                                 << max_abs(an.params[p]) << ")");
    BOOST_TEST(err <= kFdTol);
    // A zero analytic gradient would make the check vacuous.
    BOOST_TEST(max_abs(an.params[p]) > 1e-3);
  }
  if (x_has_grad) {
    const double err = probed_error(finite_difference(f, x, an.dx), an.dx);
    BOOST_TEST_MESSAGE(layer.kind() << " d/dx fd error " << err);
    BOOST_TEST_INFO(layer.kind() << " d/dx (scale " << max_abs(an.dx) << ")");
    BOOST_TEST(err <= kFdTol);
    BOOST_TEST(max_abs(an.dx) > 1e-3);
  } else {
    BOOST_TEST(max_abs(an.dx) == 0.0);
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(layer_gradients)

BOOST_AUTO_TEST_CASE(linear_with_bias) {
  Linear<double> l(8, 6);
  const ActShape s{2, 3, 8};
  check_gradients(l, s, random_input(s, 5));
}

BOOST_AUTO_TEST_CASE(linear_without_bias_lm_head) {
  Linear<double> l(8, 11, /*bias=*/false);
  BOOST_TEST(l.param_specs().size() == 1u);
  const ActShape s{2, 4, 8};
  check_gradients(l, s, random_input(s, 5));
}

BOOST_AUTO_TEST_CASE(layer_norm) {
  LayerNorm<double> l(8);
  const ActShape s{2, 5, 8};
  HostVec x = random_input(s, 5);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 3.0 + 2.0 * x[i];  // non-zero mean
  check_gradients(l, s, x);
}

BOOST_AUTO_TEST_CASE(rms_norm) {
  RMSNorm<double> l(8, 1e-6);
  const ActShape s{2, 5, 8};
  HostVec x = random_input(s, 5);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 1.0 + 2.0 * x[i];  // non-zero mean: not a LayerNorm
  check_gradients(l, s, x);
}

BOOST_AUTO_TEST_CASE(swiglu) {
  SwiGLU<double> l(6);
  const ActShape s{2, 3, 12};
  HostVec x = random_input(s, 5);
  for (auto& v : x) v *= 4.0;  // both tails of the sigmoid
  check_gradients(l, s, x);
}

BOOST_AUTO_TEST_CASE(gelu) {
  Gelu<double> l(8);
  const ActShape s{2, 3, 8};
  HostVec x = random_input(s, 5);
  for (auto& v : x) v *= 3.0;  // cover both tails of the tanh
  check_gradients(l, s, x);
}

BOOST_AUTO_TEST_CASE(layer_norm_linear) {
  LayerNormLinear<double> l(8, 12);
  const ActShape s{2, 4, 8};
  check_gradients(l, s, random_input(s, 5));
}

BOOST_AUTO_TEST_CASE(layer_norm_mlp) {
  LayerNormMLP<double> l(8, 16);
  const ActShape s{2, 4, 8};
  check_gradients(l, s, random_input(s, 5));
}

BOOST_AUTO_TEST_CASE(swiglu_mlp) {
  SwiGLUMLP<double> l(8, 12);
  BOOST_TEST(l.param_specs().size() == 3u);  // norm.gamma, gate_up.weight, down.weight: no biases
  const ActShape s{2, 4, 8};
  check_gradients(l, s, random_input(s, 5));
}

BOOST_AUTO_TEST_CASE(causal_self_attention) {
  CausalSelfAttention<double> l(8, 2);
  const ActShape s{2, 5, 8};
  check_gradients(l, s, random_input(s, 5));
}

BOOST_AUTO_TEST_CASE(grouped_query_attention_with_rope) {
  // Llama's attention: 4 query heads sharing 2 k/v heads, rotary embeddings,
  // no biases; and multi-query (1 k/v head) with biases.
  CausalSelfAttention<double> gqa(16, 4, {2, 10000.0, false});
  BOOST_TEST(gqa.param_specs().size() == 2u);
  const ActShape s{2, 5, 16};
  check_gradients(gqa, s, random_input(s, 5));
  CausalSelfAttention<double> mqa(8, 2, {1, 500.0, true});
  const ActShape s2{1, 6, 8};
  check_gradients(mqa, s2, random_input(s2, 5));
}

BOOST_AUTO_TEST_CASE(causal_self_attention_more_batches_than_heads) {
  // batch > heads takes the other loop order of the per-(batch, head) GEMMs.
  CausalSelfAttention<double> l(8, 2);
  const ActShape s{3, 4, 8};
  check_gradients(l, s, random_input(s, 5));
}

BOOST_AUTO_TEST_CASE(transformer_layer) {
  TransformerLayer<double> l(8, 2, 16);
  BOOST_TEST(l.param_specs().size() == 12u);
  const ActShape s{2, 4, 8};
  check_gradients(l, s, random_input(s, 5));
}

BOOST_AUTO_TEST_CASE(transformer_layer_seq3_four_heads) {
  TransformerLayer<double> l(8, 4, 16);
  const ActShape s{2, 3, 8};
  check_gradients(l, s, random_input(s, 9), true, 23);
}

BOOST_AUTO_TEST_CASE(llama_layer) {
  LlamaBlockConfig c;
  c.d_model = 8;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn = 12;
  c.rope_theta = 100.0;
  LlamaLayer<double> l(c);
  BOOST_TEST(l.param_specs().size() == 6u);
  const ActShape s{2, 4, 8};
  check_gradients(l, s, random_input(s, 5));
}

BOOST_AUTO_TEST_CASE(embedding_with_positions) {
  Embedding<double> l(/*vocab=*/7, /*d=*/8, /*max_seq=*/6);
  const ActShape s{2, 4, 1};
  // Repeated ids: their weight-row gradients must add up.
  const HostVec ids{3, 0, 3, 6, 1, 3, 5, 0};
  check_gradients(l, s, ids, /*x_has_grad=*/false);
}

BOOST_AUTO_TEST_CASE(embedding_without_positions) {
  Embedding<double> l(5, 8);
  const ActShape s{2, 3, 1};
  const HostVec ids{4, 0, 2, 2, 1, 3};
  check_gradients(l, s, ids, /*x_has_grad=*/false);
}

BOOST_AUTO_TEST_SUITE_END()

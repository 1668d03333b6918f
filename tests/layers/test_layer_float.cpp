// The float instantiation against the double one on identical inputs.
// Forward: max |y_f - y_d| / max |y_d| <= 1e-5. float's unit roundoff is
// 6e-8; the layers here sum at most a few dozen terms per output and pass
// through LayerNorm/softmax, whose condition numbers are O(1..10) on these
// inputs, so errors are ~1e-7..1e-6, while a float-only bug (wrong
// instantiation, a constant rounded to the wrong type) shows as >= 1e-3.
// Backward (dx and every parameter gradient, relative to each one's scale):
// also 1e-5; measured errors are <= 4e-7 for both directions.
#include <boost/test/unit_test.hpp>

#include <memory>

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

constexpr double kForwardTol = 1e-5;
constexpr double kBackwardTol = 1e-5;

void compare(Layer<float>& lf, Layer<double>& ld, ActShape s, const HostVec& x) {
  std::mt19937_64 rng(3);
  const auto hp = random_params(ld, 17);
  const HostVec r = random_vec(static_cast<std::size_t>(s.rows() * ld.out_features()), rng);
  const HostVec yd = run_forward(ld, x, s, params_to_device<double>(hp));
  const HostVec yf = run_forward(lf, x, s, params_to_device<float>(hp));
  const double ferr = rel_err(yf, yd, 1e-30);
  BOOST_TEST_MESSAGE(ld.kind() << " float forward error " << ferr);
  BOOST_TEST_INFO(ld.kind() << " forward");
  BOOST_TEST(ferr <= kForwardTol);

  const Gradients gd = run_backward(ld, x, s, params_to_device<double>(hp), r);
  const Gradients gf = run_backward(lf, x, s, params_to_device<float>(hp), r);
  double berr = rel_err(gf.dx, gd.dx);
  BOOST_TEST_INFO(ld.kind() << " dx");
  BOOST_TEST(rel_err(gf.dx, gd.dx) <= kBackwardTol);
  const auto specs = ld.param_specs();
  for (std::size_t p = 0; p < specs.size(); ++p) {
    berr = std::max(berr, rel_err(gf.params[p], gd.params[p]));
    BOOST_TEST_INFO(ld.kind() << " d/d" << specs[p].name);
    BOOST_TEST(rel_err(gf.params[p], gd.params[p]) <= kBackwardTol);
  }
  BOOST_TEST_MESSAGE(ld.kind() << " float backward max error " << berr);
}


}  // namespace

BOOST_AUTO_TEST_SUITE(layer_float_vs_double)

BOOST_AUTO_TEST_CASE(linear) {
  Linear<float> f(8, 6);
  Linear<double> d(8, 6);
  compare(f, d, {2, 4, 8}, random_input({2, 4, 8}, 8));
}

BOOST_AUTO_TEST_CASE(linear_bias_epilogue) {
  // Sizes multiples of 8: on CUDA the bias is added in cuBLASLt's epilogue
  // (exact f32 compute), as LayerNormMLP's fc1 takes the bias + GELU one.
  Linear<float> f(16, 24);
  Linear<double> d(16, 24);
  compare(f, d, {2, 8, 16}, random_input({2, 8, 16}, 8));
}

BOOST_AUTO_TEST_CASE(layer_norm) {
  LayerNorm<float> f(8);
  LayerNorm<double> d(8);
  compare(f, d, {2, 4, 8}, random_input({2, 4, 8}, 8));
}

BOOST_AUTO_TEST_CASE(layer_norm_wide_rows) {
  // Row widths the CUDA row kernels hold in registers at 4, 12 and 16
  // 16-byte chunks per lane (512, 1536 and 2048 floats: 2048 is the large
  // benchmark model's width).
  for (std::int64_t w : {512, 1536, 2048}) {
    LayerNorm<float> f(w);
    LayerNorm<double> d(w);
    compare(f, d, {1, 3, w}, random_input({1, 3, w}, 8));
  }
}

BOOST_AUTO_TEST_CASE(rms_norm) {
  RMSNorm<float> f(8);
  RMSNorm<double> d(8);
  compare(f, d, {2, 4, 8}, random_input({2, 4, 8}, 8));
}

BOOST_AUTO_TEST_CASE(swiglu) {
  SwiGLU<float> f(8);
  SwiGLU<double> d(8);
  compare(f, d, {2, 4, 16}, random_input({2, 4, 16}, 8));
}

BOOST_AUTO_TEST_CASE(swiglu_mlp) {
  SwiGLUMLP<float> f(16, 24);
  SwiGLUMLP<double> d(16, 24);
  compare(f, d, {2, 8, 16}, random_input({2, 8, 16}, 8));
}

BOOST_AUTO_TEST_CASE(grouped_query_attention_with_rope) {
  CausalSelfAttention<float> f(16, 4, {2, 10000.0, false});
  CausalSelfAttention<double> d(16, 4, {2, 10000.0, false});
  compare(f, d, {2, 6, 16}, random_input({2, 6, 16}, 8));
}

BOOST_AUTO_TEST_CASE(llama_layer) {
  LlamaBlockConfig c;
  c.d_model = 16;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn = 24;
  LlamaLayer<float> f(c);
  LlamaLayer<double> d(c);
  compare(f, d, {2, 7, 16}, random_input({2, 7, 16}, 8));
}

BOOST_AUTO_TEST_CASE(gelu) {
  Gelu<float> f(8);
  Gelu<double> d(8);
  compare(f, d, {2, 4, 8}, random_input({2, 4, 8}, 8));
}

BOOST_AUTO_TEST_CASE(layer_norm_linear) {
  LayerNormLinear<float> f(8, 12);
  LayerNormLinear<double> d(8, 12);
  compare(f, d, {2, 4, 8}, random_input({2, 4, 8}, 8));
}

BOOST_AUTO_TEST_CASE(layer_norm_mlp) {
  LayerNormMLP<float> f(8, 16);
  LayerNormMLP<double> d(8, 16);
  compare(f, d, {2, 4, 8}, random_input({2, 4, 8}, 8));
}

BOOST_AUTO_TEST_CASE(causal_self_attention) {
  CausalSelfAttention<float> f(8, 2);
  CausalSelfAttention<double> d(8, 2);
  compare(f, d, {2, 5, 8}, random_input({2, 5, 8}, 8));
}

BOOST_AUTO_TEST_CASE(transformer_layer) {
  TransformerLayer<float> f(8, 2, 16);
  TransformerLayer<double> d(8, 2, 16);
  compare(f, d, {2, 5, 8}, random_input({2, 5, 8}, 8));
}

BOOST_AUTO_TEST_CASE(transformer_layer_head_dim_64) {
  // Head dim 64, seq not a multiple of 64: on CUDA the fused f32 attention
  // kernel (automatic path) inside the whole layer, with the epilogues.
  TransformerLayer<float> f(128, 2, 256);
  TransformerLayer<double> d(128, 2, 256);
  compare(f, d, {2, 70, 128}, random_input({2, 70, 128}, 8));
}

BOOST_AUTO_TEST_CASE(embedding) {
  Embedding<float> f(7, 8, 5);
  Embedding<double> d(7, 8, 5);
  compare(f, d, {2, 3, 1}, {1, 6, 6, 0, 2, 5});
}

BOOST_AUTO_TEST_SUITE_END()

// The 16-bit compute instantiations (bf16, f16: FSDP2's param_dtype) against
// the double one on the SAME inputs: parameters and x rounded to the 16-bit
// type first, so what remains is the error of computing in 16-bit storage
// with f32 accumulation. The double layers' gradients are themselves checked
// against f64 finite differences (test_layer_gradients.cpp), so this bounds
// the 16-bit gradients against that reference.
//
// Errors are relative to each output's scale (rel_err). Every stored
// activation rounds once, by at most the unit roundoff (bf16 2^-8 = 3.9e-3,
// f16 2^-11 = 4.9e-4) and a composite layer stacks up to ~6 such roundings,
// amplified by LayerNorm/softmax by O(1..10) on these inputs; parameter
// gradients accumulate in f32 from rounded activations. Tolerances: bf16 3e-2,
// f16 4e-3, 3-4x the measured worst case on the host (bf16 9.2e-3, f16 9.8e-4,
// both LayerNormMLP/TransformerLayer gradients; printed per layer below). A
// wrong instantiation or a kernel that rounds an intermediate to 16 bits
// where it should not shows as >= 1e-1.
#include <boost/test/unit_test.hpp>

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
#include "kshard/error.hpp"
#include "layer_test_util.hpp"

using namespace kshard;
using namespace kshard::test;

namespace {

template <class T>
double tolerance() {
  return std::is_same_v<T, bfloat16_t> ? 3e-2 : 4e-3;
}
template <class T>
const char* type_name() {
  return std::is_same_v<T, bfloat16_t> ? "bf16" : "f16";
}

struct Run {
  HostVec y, dx;
  std::vector<HostVec> grads;
};

template <class T>
Run run_lp(Layer<T>& layer, const HostVec& x, ActShape s, const std::vector<HostVec>& hp,
           const HostVec& r, bool ids) {
  std::vector<Kokkos::View<const T*>> params;
  for (const auto& p : hp) params.push_back(to_device<T>(p, "param"));
  Kokkos::View<T*> y("y", std::size_t(s.rows() * layer.out_features()));
  if (ids) {
    Kokkos::View<std::int32_t*> id("ids", x.size());
    auto h = Kokkos::create_mirror_view(id);
    for (std::size_t i = 0; i < x.size(); ++i) h(i) = std::int32_t(x[i]);
    Kokkos::deep_copy(id, h);
    layer.forward_tokens(id, s, params, y);
  } else {
    layer.forward(to_device<T>(x, "x"), s, params, y);
  }
  auto grads = allocate_gradients(layer);
  Kokkos::View<T*> dx("dx", x.size());
  layer.backward(to_device<T>(r, "dy"), params, grads, dx);
  Run out;
  out.y = to_host(y);
  out.dx = to_host(dx);
  for (auto& g : grads) out.grads.push_back(to_host(g));
  return out;
}

template <class T>
void compare(Layer<T>& lp, Layer<double>& ld, ActShape s, HostVec x, bool ids = false) {
  std::mt19937_64 rng(3);
  std::vector<HostVec> hp = random_params(ld, 17);
  for (auto& p : hp) p = rounded<T>(p);
  if (!ids) x = rounded<T>(x);
  const HostVec r =
      rounded<T>(random_vec(static_cast<std::size_t>(s.rows() * ld.out_features()), rng));
  const Gradients gd = run_backward(ld, x, s, params_to_device<double>(hp), r);
  const HostVec yd = run_forward(ld, x, s, params_to_device<double>(hp));
  const Run got = run_lp(lp, x, s, hp, r, ids);
  const double tol = tolerance<T>();
  const double ferr = rel_err(got.y, yd, 1e-30);
  BOOST_TEST_INFO(ld.kind() << " " << type_name<T>() << " forward");
  BOOST_TEST(ferr <= tol);
  double berr = ids ? 0.0 : rel_err(got.dx, gd.dx);
  BOOST_TEST_INFO(ld.kind() << " " << type_name<T>() << " dx");
  BOOST_TEST(berr <= tol);
  const auto specs = ld.param_specs();
  for (std::size_t p = 0; p < specs.size(); ++p) {
    const double e = rel_err(got.grads[p], gd.params[p]);
    berr = std::max(berr, e);
    BOOST_TEST_INFO(ld.kind() << " " << type_name<T>() << " d/d" << specs[p].name);
    BOOST_TEST(e <= tol);
  }
  BOOST_TEST_MESSAGE(ld.kind() << " " << type_name<T>() << " forward error " << ferr
                               << ", backward max error " << berr << " (tol " << tol << ")");
}


template <class T>
void all_layers() {
  {
    Linear<T> l(8, 6);
    Linear<double> d(8, 6);
    compare(l, d, {2, 4, 8}, random_input({2, 4, 8}, 8));
  }
  {
    // Sizes multiples of 8: on CUDA the bias is added in cuBLASLt's epilogue
    // (LayerNormMLP below also takes the bias + GELU epilogue for fc1).
    Linear<T> l(16, 24);
    Linear<double> d(16, 24);
    compare(l, d, {2, 8, 16}, random_input({2, 8, 16}, 8));
  }
  {
    LayerNorm<T> l(8);
    LayerNorm<double> d(8);
    compare(l, d, {2, 4, 8}, random_input({2, 4, 8}, 8));
  }
  {
    RMSNorm<T> l(8);
    RMSNorm<double> d(8);
    compare(l, d, {2, 4, 8}, random_input({2, 4, 8}, 8));
  }
  {
    SwiGLU<T> l(8);
    SwiGLU<double> d(8);
    compare(l, d, {2, 4, 16}, random_input({2, 4, 16}, 8));
  }
  {
    Gelu<T> l(8);
    Gelu<double> d(8);
    compare(l, d, {2, 4, 8}, random_input({2, 4, 8}, 8));
  }
  {
    LayerNormLinear<T> l(8, 12);
    LayerNormLinear<double> d(8, 12);
    compare(l, d, {2, 4, 8}, random_input({2, 4, 8}, 8));
  }
  {
    LayerNormMLP<T> l(8, 16);
    LayerNormMLP<double> d(8, 16);
    compare(l, d, {2, 4, 8}, random_input({2, 4, 8}, 8));
  }
  {
    SwiGLUMLP<T> l(16, 24);
    SwiGLUMLP<double> d(16, 24);
    compare(l, d, {2, 8, 16}, random_input({2, 8, 16}, 8));
  }
  {
    CausalSelfAttention<T> l(16, 4, {2, 10000.0, false});
    CausalSelfAttention<double> d(16, 4, {2, 10000.0, false});
    compare(l, d, {2, 6, 16}, random_input({2, 6, 16}, 8));
  }
  {
    CausalSelfAttention<T> l(8, 2);
    CausalSelfAttention<double> d(8, 2);
    compare(l, d, {2, 5, 8}, random_input({2, 5, 8}, 8));
  }
  {
    TransformerLayer<T> l(16, 4, 32);
    TransformerLayer<double> d(16, 4, 32);
    compare(l, d, {2, 7, 16}, random_input({2, 7, 16}, 8));
  }
  {
    LlamaBlockConfig c;
    c.d_model = 16;
    c.heads = 4;
    c.kv_heads = 2;
    c.ffn = 24;
    LlamaLayer<T> l(c);
    LlamaLayer<double> d(c);
    compare(l, d, {2, 7, 16}, random_input({2, 7, 16}, 8));
  }
  {
    Embedding<T> l(300, 8, 5);  // vocab > 256: not exact as bf16 ids, fine as int32
    Embedding<double> d(300, 8, 5);
    compare(l, d, {2, 3, 1}, {1, 299, 256, 0, 2, 257}, true);
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(layer_low_precision_vs_double)

BOOST_AUTO_TEST_CASE(bf16_layers) { all_layers<bfloat16_t>(); }
BOOST_AUTO_TEST_CASE(f16_layers) { all_layers<float16_t>(); }

BOOST_AUTO_TEST_CASE(bf16_embedding_rejects_ids_stored_as_bf16) {
  Embedding<bfloat16_t> e(10, 4);
  BOOST_CHECK_THROW(e.forward(Kokkos::View<bfloat16_t*>("x", 2), {1, 2, 1}, {},
                              Kokkos::View<bfloat16_t*>("y", 8)),
                    kshard::Error);
}

BOOST_AUTO_TEST_SUITE_END()

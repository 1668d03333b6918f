// GradWrite::assign (Layer::set_grad_write): a backward that WRITES every
// parameter gradient must leave nothing of what the gradient Views held.
//
// For every layer kind, in double (the host BLAS / cuBLAS f64 path), f32 and
// bf16 (cuBLAS / cuBLASLt on the GPU) and bf16 with each fp8 recipe (the
// fp8 GEMMs and the fused bias-gradient casts): the gradients are filled with
// NaN, the layer is told to assign, and backward must give BITWISE the
// gradients and dx of an ordinary (add) backward into zeros: the same kernels
// run, only with beta 0 instead of beta 1 over zeros (x + 0 == x). Then a
// second backward without set_grad_write must add again (the mode lasts one
// call), bitwise equal to two add backwards. A NaN left anywhere (a parameter
// the layer forgot, an embedding row no token used, a position past seq)
// fails the comparison.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>

#include "kshard/engine/nn/attention.hpp"
#include "kshard/engine/nn/embedding.hpp"
#include "kshard/engine/nn/gelu.hpp"
#include "kshard/engine/nn/layer_norm.hpp"
#include "kshard/engine/nn/layer_norm_linear.hpp"
#include "kshard/engine/nn/layer_norm_mlp.hpp"
#include "kshard/engine/nn/linear.hpp"
#include "kshard/engine/nn/llama_layer.hpp"
#include "kshard/engine/nn/rms_norm.hpp"
#include "kshard/engine/nn/swiglu_mlp.hpp"
#include "kshard/engine/nn/transformer_layer.hpp"
#include "kshard/error.hpp"
#include "kshard/kernels/cast.hpp"
#include "layer_test_util.hpp"

using namespace kshard;
using namespace kshard::test;

namespace {

template <class T>
using GradList = std::vector<Kokkos::View<accum_t<T>*>>;

template <class T>
GradList<T> grads_filled(const Layer<T>& layer, accum_t<T> value) {
  GradList<T> g = allocate_gradients(layer);
  for (auto& v : g) kshard::fill<accum_t<T>>(v, value);
  return g;
}

// Elements of a that differ from b (NaN differs from everything; -0 == +0).
std::int64_t differing(const HostVec& a, const HostVec& b) {
  if (a.size() != b.size()) return std::int64_t(std::max(a.size(), b.size()));
  std::int64_t n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) n += !(a[i] == b[i]);
  return n;
}

template <class T>
void check_assign(Layer<T>& layer, ActShape s, std::uint64_t seed = 3) {
  using A = accum_t<T>;
  BOOST_TEST_CONTEXT(layer.kind() << " in " << sizeof(T) << "-byte type") {
    BOOST_TEST(layer.assigns_grads());
    std::mt19937_64 rng(seed);
    const auto params = params_to_device<T>(random_params(layer, seed));
    const std::size_t ny = std::size_t(s.rows() * layer.out_features());
    HostVec x = random_input(s, seed);
    if (layer.takes_token_ids()) {
      // Ids over half the vocabulary: the other rows get no token at all.
      const auto vocab = std::int64_t(layer.param_specs()[0].shape[0]);
      for (auto& v : x) v = double(std::int64_t(rng() % std::uint64_t(std::max<std::int64_t>(vocab / 2, 1))));
    }
    const HostVec dyh = random_vec(ny, rng);
    Kokkos::View<T*> y("y", ny);
    const auto dy = to_device<T>(dyh, "dy");

    // Reference: add into zeros, once and twice.
    auto ref = grads_filled(layer, A(0));
    auto xd = forward_host_input(layer, x, s, params, y);
    Kokkos::View<T*> dx_ref("dx_ref", xd.extent(0));
    layer.backward(dy, const_views(params), ref, dx_ref);
    std::vector<HostVec> once;
    for (auto& v : ref) once.push_back(to_host(v));
    layer.backward(dy, const_views(params), ref, dx_ref);
    layer.release();

    auto got = grads_filled(layer, std::numeric_limits<A>::quiet_NaN());
    forward_host_input(layer, x, s, params, y);
    Kokkos::View<T*> dx("dx", xd.extent(0));
    layer.set_grad_write(GradWrite::assign);
    layer.backward(dy, const_views(params), got, dx);
    const auto specs = layer.param_specs();
    for (std::size_t p = 0; p < specs.size(); ++p) {
      BOOST_TEST_INFO("assigned d/d" << specs[p].name);
      BOOST_TEST(differing(to_host(got[p]), once[p]) == 0);
    }
    BOOST_TEST(differing(to_host(dx), to_host(dx_ref)) == 0);
    // The mode lasted one call: this one adds.
    layer.backward(dy, const_views(params), got, dx);
    layer.release();
    for (std::size_t p = 0; p < specs.size(); ++p) {
      BOOST_TEST_INFO("assigned then added d/d" << specs[p].name);
      BOOST_TEST(differing(to_host(got[p]), to_host(ref[p])) == 0);
    }
  }
}

LlamaBlockConfig llama(std::int64_t d, std::int64_t heads, std::int64_t kv_heads, std::int64_t ffn) {
  LlamaBlockConfig c;
  c.d_model = d;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.ffn = ffn;
  return c;
}

Fp8Policy policy(Fp8Scaling s) {
  Fp8Policy p;
  p.scaling = s;
  return p;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(grad_write)

BOOST_AUTO_TEST_CASE(every_layer_assigns_bitwise_what_it_adds_in_double) {
  Linear<double> fc(8, 5), fc_nb(8, 5, false);
  check_assign(fc, {2, 3, 8});
  check_assign(fc_nb, {2, 3, 8});
  LayerNorm<double> ln(8);
  check_assign(ln, {2, 3, 8});
  RMSNorm<double> rms(8);
  check_assign(rms, {2, 3, 8});
  Embedding<double> emb(13, 8), emb_pos(13, 8, /*max_seq=*/6);
  check_assign(emb, {2, 4, 1});
  check_assign(emb_pos, {2, 4, 1});  // positions 4, 5 unused: written as zeros
  Gelu<double> gelu(8);
  check_assign(gelu, {2, 3, 8});
  CausalSelfAttention<double> attn(8, 2);
  check_assign(attn, {2, 4, 8});
  LayerNormLinear<double> lnl(8, 6);
  check_assign(lnl, {2, 3, 8});
  LayerNormMLP<double> mlp(8, 16);
  check_assign(mlp, {2, 3, 8});
  SwiGLUMLP<double> swiglu(8, 12);
  check_assign(swiglu, {2, 3, 8});
  TransformerLayer<double> block(8, 2, 16);
  check_assign(block, {2, 4, 8});
  LlamaLayer<double> block_llama(llama(16, 4, 2, 24));
  check_assign(block_llama, {2, 4, 16});
}

// The 16-bit and f32 paths (cuBLAS / cuBLASLt epilogues and the CUDA row
// kernels on the GPU), at shapes those backends serve.
BOOST_AUTO_TEST_CASE(blocks_assign_bitwise_in_f32_and_bf16) {
  TransformerLayer<float> gpt_f(64, 4, 128);
  check_assign(gpt_f, {2, 16, 64});
  TransformerLayer<bfloat16_t> gpt(64, 4, 128);
  check_assign(gpt, {2, 16, 64});
  LlamaLayer<bfloat16_t> block_llama(llama(64, 4, 2, 96));
  check_assign(block_llama, {2, 16, 64});
  Embedding<bfloat16_t> emb(64, 64, 32);
  check_assign(emb, {2, 16, 1});
}

// fp8 products: the wgrad GEMM's beta and the bias gradient summed in the
// dy cast (fp8_cast_dbias / fp8_cast_1x128) write instead of adding.
BOOST_AUTO_TEST_CASE(fp8_linears_assign_bitwise) {
  for (Fp8Scaling s : {Fp8Scaling::current, Fp8Scaling::delayed, Fp8Scaling::block}) {
    BOOST_TEST_CONTEXT("fp8 scaling " << int(s)) {
      Linear<bfloat16_t> fc(128, 256), fc_nb(128, 256, false);
      fc.set_fp8_policy(policy(s));
      fc_nb.set_fp8_policy(policy(s));
      check_assign(fc, {2, 64, 128});
      check_assign(fc_nb, {2, 64, 128});
      TransformerLayer<bfloat16_t> block(128, 4, 256);
      block.set_fp8_policy(policy(s));
      check_assign(block, {2, 64, 128});
    }
  }
}

BOOST_AUTO_TEST_CASE(grad_write_none_is_an_error) {
  Linear<double> fc(4, 4);
  BOOST_CHECK_THROW(fc.set_grad_write(GradWrite::none), Error);
  fc.set_grad_write(GradWrite::add);  // the default, accepted
}

BOOST_AUTO_TEST_SUITE_END()

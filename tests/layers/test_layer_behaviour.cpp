// Layer contract: gradient accumulation, causal masking, argument errors,
// parameter specs.
#include <boost/test/unit_test.hpp>

#include "kshard/engine/nn/attention.hpp"
#include "kshard/engine/nn/embedding.hpp"
#include "kshard/engine/nn/gelu.hpp"
#include "kshard/engine/nn/layer_norm.hpp"
#include "kshard/engine/nn/layer_norm_linear.hpp"
#include "kshard/engine/nn/layer_norm_mlp.hpp"
#include "kshard/engine/nn/linear.hpp"
#include "kshard/engine/nn/rms_norm.hpp"
#include "kshard/engine/nn/swiglu.hpp"
#include "kshard/engine/nn/sub_layers.hpp"
#include "kshard/engine/nn/transformer_layer.hpp"
#include "kshard/error.hpp"
#include "layer_test_util.hpp"

using namespace kshard;
using namespace kshard::test;

namespace {

// Accumulation is exact up to one rounding per add: 1e-12 relative in double.
constexpr double kAccumTol = 1e-12;

void check_accumulation(Layer<double>& layer, ActShape s) {
  std::mt19937_64 rng(21);
  const auto params = params_to_device<double>(random_params(layer, 4));
  const std::size_t nx = static_cast<std::size_t>(s.numel());
  const std::size_t ny = static_cast<std::size_t>(s.rows() * layer.out_features());
  const HostVec x1 = random_vec(nx, rng), x2 = random_vec(nx, rng);
  const HostVec r1 = random_vec(ny, rng), r2 = random_vec(ny, rng);
  const Gradients g1 = run_backward(layer, x1, s, params, r1);
  const Gradients g2 = run_backward(layer, x2, s, params, r2);

  // Two micro-batches into the same gradient buffers.
  auto grads = zero_grads(layer);
  Kokkos::View<double*> y("y", ny), dx("dx", nx);
  auto x1d = to_device<double>(x1), x2d = to_device<double>(x2);
  layer.forward(x1d, s, const_views(params), y);
  layer.backward(to_device<double>(r1), const_views(params), grads, dx);
  layer.forward(x2d, s, const_views(params), y);
  layer.backward(to_device<double>(r2), const_views(params), grads, dx);
  const auto specs = layer.param_specs();
  for (std::size_t p = 0; p < specs.size(); ++p) {
    HostVec want(g1.params[p].size());
    for (std::size_t i = 0; i < want.size(); ++i) want[i] = g1.params[p][i] + g2.params[p][i];
    BOOST_TEST_INFO(layer.kind() << " accumulated d/d" << specs[p].name);
    BOOST_TEST(rel_err(to_host(grads[p]), want) <= kAccumTol);
  }
  // dx is written, not accumulated: it equals the second micro-batch's alone.
  BOOST_TEST(rel_err(to_host(dx), g2.dx) <= kAccumTol);

  // Backward twice after one forward adds twice.
  auto twice = zero_grads(layer);
  layer.forward(x1d, s, const_views(params), y);
  layer.backward(to_device<double>(r1), const_views(params), twice, dx);
  layer.backward(to_device<double>(r1), const_views(params), twice, dx);
  for (std::size_t p = 0; p < specs.size(); ++p) {
    HostVec want = g1.params[p];
    for (auto& v : want) v *= 2;
    BOOST_TEST(rel_err(to_host(twice[p]), want) <= kAccumTol);
  }
}

template <class E, class F>
void expect_error(F&& f, const char* what) {
  BOOST_TEST_INFO(what);
  BOOST_CHECK_THROW(f(), E);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(layer_behaviour)

// A composite's sub-layers by name: prefixed spec names in declaration
// order, each sub-layer's slice found by its name (so a sub-layer with more
// or fewer parameters shifts no other's), clear errors otherwise.
BOOST_AUTO_TEST_CASE(sub_layers_slice_by_name) {
  Linear<double> a(4, 3), b(3, 2, /*bias=*/false), c(2, 2);
  SubLayers<double> subs{{"a", &a}, {"b", &b}, {"", &c}};
  const auto specs = subs.specs();
  BOOST_REQUIRE_EQUAL(specs.size(), 5u);
  BOOST_TEST(specs[0].name == "a.weight");
  BOOST_TEST(specs[1].name == "a.bias");
  BOOST_TEST(specs[2].name == "b.weight");
  BOOST_TEST(specs[3].name == "weight");
  BOOST_TEST(specs[4].name == "bias");
  std::vector<Kokkos::View<const double*>> views;
  for (const auto& s : specs) views.push_back(Kokkos::View<double*>(s.name, std::size_t(s.numel())));
  const auto vb = subs.params("b", views);
  BOOST_REQUIRE_EQUAL(vb.size(), 1u);
  BOOST_TEST(vb[0].data() == views[2].data());
  const auto vc = subs.params("", views);
  BOOST_REQUIRE_EQUAL(vc.size(), 2u);
  BOOST_TEST(vc[1].data() == views[4].data());
  std::vector<Kokkos::View<double*>> grads;
  for (const auto& s : specs) grads.emplace_back(s.name, std::size_t(s.numel()));
  BOOST_TEST(subs.grads("a", grads)[1].data() == grads[1].data());
  expect_error<Error>([&] { (void)subs.params("d", views); }, "unknown sub-layer");
  views.pop_back();
  expect_error<Error>([&] { (void)subs.params("a", views); }, "a list of the wrong length");
  expect_error<Error>([&] { SubLayers<double> twice{{"a", &a}, {"a", &b}}; }, "a name twice");
}

BOOST_AUTO_TEST_CASE(gradient_accumulation_linear) {
  Linear<double> l(8, 5);
  check_accumulation(l, {2, 3, 8});
}

BOOST_AUTO_TEST_CASE(gradient_accumulation_layer_norm) {
  LayerNorm<double> l(8);
  check_accumulation(l, {2, 3, 8});
}

BOOST_AUTO_TEST_CASE(gradient_accumulation_rms_norm) {
  RMSNorm<double> l(8);
  check_accumulation(l, {2, 3, 8});
}

// RMSNorm against its closed form: a row (3, 4) has mean square 12.5, so
// y = (3, 4) / sqrt(12.5 + eps) * gamma; a zero row stays zero (no division by 0).
BOOST_AUTO_TEST_CASE(rms_norm_closed_form) {
  RMSNorm<double> l(2, 0.5);
  const ActShape s{1, 2, 2};
  const std::vector<HostVec> gamma{{2.0, -1.0}};
  const HostVec y = run_forward(l, {3.0, 4.0, 0.0, 0.0}, s, params_to_device<double>(gamma));
  const double r = 1.0 / std::sqrt(12.5 + 0.5);
  BOOST_TEST(std::abs(y[0] - 3.0 * r * 2.0) < 1e-15);
  BOOST_TEST(std::abs(y[1] - 4.0 * r * -1.0) < 1e-15);
  BOOST_TEST(y[2] == 0.0);
  BOOST_TEST(y[3] == 0.0);
}

// SwiGLU against its closed form: silu(a) * b, silu(a) = a / (1 + e^-a).
BOOST_AUTO_TEST_CASE(swiglu_closed_form) {
  SwiGLU<double> l(2);
  const HostVec y = run_forward(l, {0.0, 2.0, 3.0, -0.5}, {1, 1, 4}, {});
  BOOST_TEST(y[0] == 0.0);  // silu(0) = 0
  BOOST_TEST(std::abs(y[1] - 2.0 / (1.0 + std::exp(-2.0)) * -0.5) < 1e-15);
}

// Grouped-query attention without RoPE is multi-head attention whose k and v
// projections repeat each shared head's rows: bitwise the same output (the
// same dot products, packed by a copy).
BOOST_AUTO_TEST_CASE(grouped_query_attention_equals_repeated_heads) {
  const std::int64_t d = 16, h = 4, kv = 2, hd = d / h, g = h / kv;
  CausalSelfAttention<double> gqa(d, h, {kv, 0.0, true});
  CausalSelfAttention<double> mha(d, h);
  const auto p = random_params(gqa, 3);  // qkv.weight, qkv.bias, proj.weight, proj.bias
  std::vector<HostVec> m(4);
  m[2] = p[2];
  m[3] = p[3];
  // Output rows of the qkv projection: q heads, then k heads, then v heads.
  auto row_of = [&](std::int64_t part, std::int64_t head) {  // gqa's row block
    return part == 0 ? head * hd : (part == 1 ? h * hd : (h + kv) * hd) + (head / g) * hd;
  };
  for (std::int64_t part = 0; part < 3; ++part)
    for (std::int64_t head = 0; head < h; ++head)
      for (std::int64_t i = 0; i < hd; ++i) {
        const std::int64_t src = row_of(part, head) + i;
        for (std::int64_t c = 0; c < d; ++c) m[0].push_back(p[0][std::size_t(src * d + c)]);
        m[1].push_back(p[1][std::size_t(src)]);
      }
  const ActShape s{2, 5, d};
  std::mt19937_64 rng(4);
  const HostVec x = random_vec(std::size_t(s.numel()), rng);
  const HostVec a = run_forward(gqa, x, s, params_to_device<double>(p));
  const HostVec b = run_forward(mha, x, s, params_to_device<double>(m));
  BOOST_TEST(a == b, boost::test_tools::per_element());
}

// RoPE against a host reference written out here: one head of dim 4, q and
// k rotated by position t (pairs (0, 2), (1, 3), angle t theta^(-2i/4)),
// causal softmax attention, no biases (identity-free random weights).
BOOST_AUTO_TEST_CASE(rotary_attention_matches_a_host_reference) {
  const std::int64_t d = 4, seq = 5;
  const double theta = 100.0;
  CausalSelfAttention<double> attn(d, 1, {1, theta, false});
  const auto p = random_params(attn, 9);  // qkv.weight [12, 4], proj.weight [4, 4]
  const ActShape s{1, seq, d};
  std::mt19937_64 rng(10);
  const HostVec x = random_vec(std::size_t(s.numel()), rng);
  const HostVec got = run_forward(attn, x, s, params_to_device<double>(p));
  auto mat = [&](const HostVec& w, std::int64_t row0, std::int64_t t) {  // 4 rows of w . x_t
    std::vector<double> o(4, 0.0);
    for (std::int64_t i = 0; i < 4; ++i)
      for (std::int64_t c = 0; c < d; ++c) o[i] += w[std::size_t((row0 + i) * d + c)] * x[std::size_t(t * d + c)];
    return o;
  };
  auto rotate = [&](std::vector<double> v, std::int64_t t) {
    for (std::int64_t i = 0; i < 2; ++i) {
      const double ang = double(t) * std::pow(theta, -2.0 * double(i) / 4.0);
      const double a = v[i], b = v[i + 2];
      v[i] = a * std::cos(ang) - b * std::sin(ang);
      v[i + 2] = b * std::cos(ang) + a * std::sin(ang);
    }
    return v;
  };
  double worst = 0;
  for (std::int64_t t = 0; t < seq; ++t) {
    const auto q = rotate(mat(p[0], 0, t), t);
    std::vector<double> score(std::size_t(t + 1)), ctx(4, 0.0);
    double mx = -1e300, sum = 0;
    for (std::int64_t u = 0; u <= t; ++u) {
      const auto k = rotate(mat(p[0], 4, u), u);
      double sc = 0;
      for (int i = 0; i < 4; ++i) sc += q[i] * k[i];
      score[std::size_t(u)] = sc / 2.0;  // 1 / sqrt(head dim 4)
      mx = std::max(mx, score[std::size_t(u)]);
    }
    for (std::int64_t u = 0; u <= t; ++u) sum += std::exp(score[std::size_t(u)] - mx);
    for (std::int64_t u = 0; u <= t; ++u) {
      const auto v = mat(p[0], 8, u);
      const double w = std::exp(score[std::size_t(u)] - mx) / sum;
      for (int i = 0; i < 4; ++i) ctx[i] += w * v[i];
    }
    for (std::int64_t o = 0; o < d; ++o) {
      double y = 0;
      for (int i = 0; i < 4; ++i) y += p[1][std::size_t(o * d + i)] * ctx[i];
      worst = std::max(worst, std::abs(y - got[std::size_t(t * d + o)]));
    }
  }
  BOOST_TEST(worst < 1e-12);
}

BOOST_AUTO_TEST_CASE(gradient_accumulation_transformer_layer) {
  TransformerLayer<double> l(8, 2, 16);
  check_accumulation(l, {2, 4, 8});
}

BOOST_AUTO_TEST_CASE(causal_mask_future_tokens_do_not_change_the_past) {
  // For the attention layer alone and the whole block: changing the input at
  // position t of one sequence leaves every output at positions < t (and the
  // other sequence) bitwise unchanged, and does change position t onwards.
  const std::int64_t batch = 2, seq = 5, d = 8, t = 2;
  CausalSelfAttention<double> attn(d, 2);
  TransformerLayer<double> block(d, 2, 16);
  for (Layer<double>* layer : {static_cast<Layer<double>*>(&attn),
                               static_cast<Layer<double>*>(&block)}) {
    const ActShape s{batch, seq, d};
    std::mt19937_64 rng(2);
    const auto params = params_to_device<double>(random_params(*layer, 6));
    HostVec x = random_vec(static_cast<std::size_t>(s.numel()), rng);
    const HostVec y0 = run_forward(*layer, x, s, params);
    // A random change: a constant shift of a row would vanish in LayerNorm.
    const HostVec delta = random_vec(static_cast<std::size_t>(d), rng);
    for (std::int64_t j = 0; j < d; ++j) x[static_cast<std::size_t>(t * d + j)] += delta[j];
    const HostVec y1 = run_forward(*layer, x, s, params);
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t i = 0; i < seq; ++i) {
        double diff = 0;
        for (std::int64_t j = 0; j < d; ++j) {
          const std::size_t k = static_cast<std::size_t>((b * seq + i) * d + j);
          diff = std::max(diff, std::abs(y1[k] - y0[k]));
        }
        BOOST_TEST_INFO(layer->kind() << " batch " << b << " position " << i);
        if (b == 0 && i >= t)
          BOOST_TEST(diff > 1e-6);
        else
          BOOST_TEST(diff == 0.0);
      }
  }
}

BOOST_AUTO_TEST_CASE(attention_first_position_sees_only_itself) {
  // Position 0 attends only to itself (softmax over one key = 1), so its
  // output equals that of a length-1 sequence holding the same token.
  CausalSelfAttention<double> attn(8, 2);
  const auto params = params_to_device<double>(random_params(attn, 3));
  std::mt19937_64 rng(4);
  const HostVec x = random_vec(2 * 4 * 8, rng);
  const HostVec y = run_forward(attn, x, {2, 4, 8}, params);
  for (std::int64_t b = 0; b < 2; ++b) {
    const HostVec x0(x.begin() + b * 32, x.begin() + b * 32 + 8);
    const HostVec y0 = run_forward(attn, x0, {1, 1, 8}, params);
    const HostVec want(y.begin() + b * 32, y.begin() + b * 32 + 8);
    BOOST_TEST(rel_err(y0, want) <= 1e-14);
  }
}

BOOST_AUTO_TEST_CASE(params_and_grads_as_slices_of_one_flat_buffer) {
  // What an FSDP unit does: one all-gathered flat buffer, each parameter a
  // subview into it (padded, so slices do not start at 0 or end at the end),
  // and one flat gradient buffer that is later reduce-scattered.
  TransformerLayer<double> block(8, 2, 16);
  const auto specs = block.param_specs();
  const auto hp = random_params(block, 12);
  const std::int64_t pad = 3, total = param_numel(specs) + 2 * pad;
  HostVec flat_h(static_cast<std::size_t>(total), 0.0);
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  std::int64_t off = pad;
  for (std::size_t p = 0; p < specs.size(); ++p) {
    std::copy(hp[p].begin(), hp[p].end(), flat_h.begin() + off);
    ranges.emplace_back(off, off + specs[p].numel());
    off += specs[p].numel();
  }
  auto flat = to_device<double>(flat_h, "flat");
  Kokkos::View<double*> flat_grad("flat_grad", static_cast<std::size_t>(total));
  std::vector<Kokkos::View<double*>> pv, gv;
  for (const auto& r : ranges) {
    pv.push_back(Kokkos::subview(flat, r));
    gv.push_back(Kokkos::subview(flat_grad, r));
  }
  const ActShape s{2, 3, 8};
  std::mt19937_64 rng(5);
  const HostVec x = random_vec(static_cast<std::size_t>(s.numel()), rng);
  const HostVec r = random_vec(static_cast<std::size_t>(s.numel()), rng);
  const Gradients want = run_backward(block, x, s, params_to_device<double>(hp), r);

  auto xd = to_device<double>(x);
  Kokkos::View<double*> y("y", x.size()), dx("dx", x.size());
  block.forward(xd, s, const_views(pv), y);
  block.backward(to_device<double>(r), const_views(pv), gv, dx);
  BOOST_TEST(rel_err(to_host(dx), want.dx) <= 1e-14);
  const HostVec g = to_host(flat_grad);
  for (std::size_t p = 0; p < specs.size(); ++p) {
    const HostVec got(g.begin() + ranges[p].first, g.begin() + ranges[p].second);
    BOOST_TEST(rel_err(got, want.params[p]) <= 1e-14);
  }
  // The padding is untouched.
  for (std::int64_t i = 0; i < pad; ++i) {
    BOOST_TEST(g[static_cast<std::size_t>(i)] == 0.0);
    BOOST_TEST(g[static_cast<std::size_t>(total - 1 - i)] == 0.0);
  }
}

BOOST_AUTO_TEST_CASE(param_specs_names_shapes_and_init) {
  TransformerLayer<float> block(8, 2, 16);
  const auto s = block.param_specs();
  const std::vector<std::string> names{"ln1.gamma",      "ln1.beta",        "attn.qkv.weight",
                                       "attn.qkv.bias",  "attn.proj.weight", "attn.proj.bias",
                                       "mlp.ln.gamma",   "mlp.ln.beta",     "mlp.fc1.weight",
                                       "mlp.fc1.bias",   "mlp.fc2.weight",  "mlp.fc2.bias"};
  BOOST_REQUIRE_EQUAL(s.size(), names.size());
  for (std::size_t i = 0; i < s.size(); ++i) BOOST_TEST(s[i].name == names[i]);
  BOOST_TEST(s[2].shape == (std::vector<std::int64_t>{24, 8}));
  BOOST_TEST(s[8].shape == (std::vector<std::int64_t>{16, 8}));
  BOOST_TEST(s[10].shape == (std::vector<std::int64_t>{8, 16}));
  BOOST_TEST((s[0].init.kind == Init::Kind::ones));
  BOOST_TEST((s[1].init.kind == Init::Kind::zeros));
  BOOST_TEST((s[10].init.kind == Init::Kind::uniform));
  BOOST_TEST(s[10].init.scale == 0.25);  // 1/sqrt(fan_in = 16)
  BOOST_TEST(param_numel(s) == 16 + 24 * 8 + 24 + 64 + 8 + 16 + 16 * 8 + 16 + 8 * 16 + 8);
  BOOST_TEST(block.kind() == "TransformerLayer");
  BOOST_TEST(block.output_shape({2, 3, 8}).features == 8);

  LayerNormLinear<float> lnl(8, 4, /*bias=*/false);
  const auto t = lnl.param_specs();
  BOOST_REQUIRE_EQUAL(t.size(), 3u);
  BOOST_TEST(t[2].name == "weight");
  Embedding<float> emb(10, 4, 3);
  BOOST_TEST(emb.param_specs()[1].name == "position");
  BOOST_TEST(emb.in_features() == 1);
}

BOOST_AUTO_TEST_CASE(bad_shapes_and_arguments_throw) {
  Linear<float> l(4, 3);
  auto p = allocate_parameters(l);
  auto cp = const_views(p);
  auto g = zero_grads(l);
  Kokkos::View<float*> x("x", 2 * 4), y("y", 2 * 3), dx("dx", 2 * 4), dy("dy", 2 * 3);
  const ActShape s{1, 2, 4};

  expect_error<Error>([&] { l.backward(dy, cp, g, dx); }, "backward before forward");
  expect_error<Error>([&] { l.forward(x, {1, 2, 5}, cp, y); }, "features != in_features");
  expect_error<Error>([&] { l.forward(x, {1, 3, 4}, cp, y); }, "x too small for shape");
  expect_error<Error>([&] { l.forward(x, {0, 2, 4}, cp, y); }, "empty batch");
  expect_error<Error>([&] { l.forward(x, s, cp, Kokkos::View<float*>("y", 5)); }, "y size");
  expect_error<Error>([&] { l.forward(x, s, {cp[0]}, y); }, "missing param");
  expect_error<Error>([&] { l.forward(x, s, {cp[0], Kokkos::View<float*>("b", 4)}, y); },
                      "bias size");
  l.forward(x, s, cp, y);
  expect_error<Error>([&] { l.backward(Kokkos::View<float*>("dy", 5), cp, g, dx); }, "dy size");
  expect_error<Error>([&] { l.backward(dy, cp, g, Kokkos::View<float*>("dx", 7)); }, "dx size");
  expect_error<Error>([&] { l.backward(dy, cp, {g[0]}, dx); }, "missing grad");
  BOOST_CHECK_NO_THROW(l.backward(dy, cp, g, dx));
  l.release();
  expect_error<Error>([&] { l.backward(dy, cp, g, dx); }, "backward after release");

  expect_error<Error>([] { Linear<float>(0, 3); }, "Linear zero in");
  expect_error<Error>([] { LayerNorm<float>(0); }, "LayerNorm zero");
  expect_error<Error>([] { LayerNorm<float>(4, 0.0); }, "LayerNorm eps 0");
  expect_error<Error>([] { RMSNorm<float>(0); }, "RMSNorm zero");
  expect_error<Error>([] { SwiGLU<float>(0); }, "SwiGLU zero");
  expect_error<Error>([] { CausalSelfAttention<float>(16, 4, {3}); }, "kv_heads not dividing heads");
  expect_error<Error>([] { CausalSelfAttention<float>(12, 4, {0, 10000.0}); }, "RoPE, odd head dim");
  expect_error<Error>([] { CausalSelfAttention<float>(16, 4, {0, -1.0}); }, "negative rope_theta");
  expect_error<Error>([] { RMSNorm<float>(4, -1e-5); }, "RMSNorm eps < 0");
  expect_error<Error>([] { CausalSelfAttention<float>(10, 3); }, "d not divisible by heads");
  expect_error<Error>([] { TransformerLayer<float>(8, 0, 16); }, "zero heads");
  expect_error<Error>([] { LayerNormMLP<float>(8, 0); }, "zero hidden");
  expect_error<Error>([] { Embedding<float>(0, 4); }, "empty vocab");
  // Token ids are int32: ids stored as T (not every id is exact in T) are an
  // error, even valid small ones in double.
  Embedding<double> e(5, 4, 3);
  auto ep = const_views(allocate_parameters(e));
  Kokkos::View<double*> ey("y", 3 * 4);
  Kokkos::View<double*> ey4("y", 4 * 4);
  expect_error<Error>([&] { e.forward(to_device<double>({4, 0, 2}), {1, 3, 1}, ep, ey); },
                      "ids stored as double");
  // Ids in [0, vocab), seq <= max_seq, parameter sizes (forward_tokens).
  auto ids = [](std::vector<std::int32_t> v) {
    Kokkos::View<std::int32_t*> d("ids", v.size());
    auto h = Kokkos::create_mirror_view(d);
    for (std::size_t i = 0; i < v.size(); ++i) h(i) = v[i];
    Kokkos::deep_copy(d, h);
    return d;
  };
  expect_error<Error>([&] { e.forward_tokens(ids({1, 5, 2}), {1, 3, 1}, ep, ey); },
                      "int32 id == vocab");
  expect_error<Error>([&] { e.forward_tokens(ids({1, -1, 2}), {1, 3, 1}, ep, ey); },
                      "negative int32 id");
  expect_error<Error>([&] { e.forward_tokens(ids({1, 2, 3, 4}), {1, 4, 1}, ep, ey4); },
                      "int32 ids, seq > max_seq");
  expect_error<Error>(
      [&] { e.forward_tokens(ids({1, 2, 3}), {1, 3, 1}, {ep[0], Kokkos::View<double*>("p", 2)}, ey); },
      "int32 ids, position table of the wrong size");
  BOOST_CHECK_NO_THROW(e.forward_tokens(ids({4, 0, 2}), {1, 3, 1}, ep, ey));

  // Error messages say what was wrong and what was expected.
  try {
    l.forward(x, {1, 2, 5}, cp, y);
    BOOST_FAIL("no throw");
  } catch (const Error& err) {
    BOOST_TEST(std::string(err.what()).find("Linear::forward") != std::string::npos);
    BOOST_TEST(err.expected().find("in_features=4") != std::string::npos);
  }
}

BOOST_AUTO_TEST_SUITE_END()

namespace {
// The recompute path runs the unfused kernels twice on the same inputs: its
// output and every gradient equal the unfused path's bit for bit.
template <class T>
void check_recompute_equals_unfused() {
  CausalSelfAttention<T> attn(32, 4);
  const ActShape s{2, 13, 32};  // seq not a multiple of anything
  std::mt19937_64 rng(5);
  const auto params = params_to_device<T>(random_params(attn, 11));
  const HostVec x = random_vec(std::size_t(s.numel()), rng);
  const HostVec r = random_vec(std::size_t(s.numel()), rng);
  set_attention_impl(AttentionImpl::unfused);
  const HostVec y1 = run_forward(attn, x, s, params);
  const Gradients g1 = run_backward(attn, x, s, params, r);
  set_attention_impl(AttentionImpl::recompute);
  BOOST_TEST((resolved_attention_impl<T>() == AttentionImpl::recompute));
  const HostVec y2 = run_forward(attn, x, s, params);
  const Gradients g2 = run_backward(attn, x, s, params, r);
  set_attention_impl(AttentionImpl::automatic);
  BOOST_TEST(y1 == y2);
  BOOST_TEST(g1.dx == g2.dx);
  BOOST_REQUIRE_EQUAL(g1.params.size(), g2.params.size());
  for (std::size_t i = 0; i < g1.params.size(); ++i) BOOST_TEST(g1.params[i] == g2.params[i]);
}
}  // namespace

BOOST_AUTO_TEST_CASE(attention_recompute_equals_unfused_bitwise) {
  check_recompute_equals_unfused<float>();
  check_recompute_equals_unfused<double>();
}

// automatic resolves per shape: on CUDA, f32 takes the fused path where the
// exact-f32 kernel serves the head dim (64, 128), recompute elsewhere; f64
// stays on recompute. Host builds run fused everywhere.
BOOST_AUTO_TEST_CASE(attention_automatic_path_depends_on_the_shape) {
  set_attention_impl(AttentionImpl::automatic);
#if defined(KOKKOS_ENABLE_CUDA)
  const AttentionImpl f32 = AttentionImpl::fused, other = AttentionImpl::recompute;
#else
  const AttentionImpl f32 = AttentionImpl::fused, other = AttentionImpl::fused;
#endif
  BOOST_TEST((resolved_attention_impl<float>(4, 1024, 2048, 16) == f32));  // hd 128
  BOOST_TEST((resolved_attention_impl<float>(8, 100, 1024, 16) == f32));   // hd 64
  BOOST_TEST((resolved_attention_impl<float>(2, 13, 32, 4) == other));     // hd 8
  BOOST_TEST((resolved_attention_impl<double>(4, 1024, 2048, 16) == other));
  set_attention_impl(AttentionImpl::unfused);  // an explicit choice wins
  BOOST_TEST((resolved_attention_impl<float>(4, 1024, 2048, 16) == AttentionImpl::unfused));
  set_attention_impl(AttentionImpl::automatic);
}

// Embedding's weight gradient is the sum of each id's rows in row order,
// bitwise (no float atomics): compared with that sum done here on the host in
// float, for ids with long runs of repeats (a frequent token) and ids unused.
BOOST_AUTO_TEST_CASE(embedding_weight_gradient_is_the_row_order_sum_bitwise) {
  const std::int64_t vocab = 11, d = 24, batch = 3, seq = 40, rows = batch * seq;
  Embedding<float> l(vocab, d);
  std::mt19937_64 rng(5);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r)
    ids[std::size_t(r)] = r % 3 == 0 ? 4 : std::int32_t(rng() % 9);  // 9, 10 unused
  Kokkos::View<std::int32_t*> idd("ids", std::size_t(rows));
  auto idh = Kokkos::create_mirror_view(idd);
  for (std::int64_t r = 0; r < rows; ++r) idh(r) = ids[std::size_t(r)];
  Kokkos::deep_copy(idd, idh);
  const auto params = params_to_device<float>(random_params(l, 3));
  const HostVec dyv = random_vec(std::size_t(rows * d), rng);
  Kokkos::View<float*> y("y", std::size_t(rows * d)), dx("dx", std::size_t(rows));
  for (int rep = 0; rep < 2; ++rep) {
    auto grads = zero_grads(l);
    l.forward_tokens(idd, {batch, seq, 1}, const_views(params), y);
    l.backward(to_device<float>(dyv), const_views(params), grads, dx);
    const HostVec got = to_host(grads[0]);
    std::int64_t bad = 0;
    for (std::int64_t v = 0; v < vocab; ++v)
      for (std::int64_t c = 0; c < d; ++c) {
        float s = 0;
        for (std::int64_t r = 0; r < rows; ++r)
          if (ids[std::size_t(r)] == v) s += float(dyv[std::size_t(r * d + c)]);
        bad += double(s) != got[std::size_t(v * d + c)];
      }
    BOOST_TEST(bad == 0, "repeat " << rep << ": " << bad << " weight-gradient elements differ");
  }
}

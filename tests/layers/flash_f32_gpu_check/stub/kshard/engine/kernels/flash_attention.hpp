#pragma once
#include <cstdint>
namespace kshard { template <class T> using accum_t = T;
namespace detail {
template <class T> struct FlashArgs {
  const T* qkv = nullptr; const T* ctx = nullptr; const T* dctx = nullptr; T* out = nullptr;
  T* lse = nullptr; const T* lse_in = nullptr; T* delta = nullptr;
  std::int64_t batch = 0, seq = 0, d = 0, heads = 0;
  std::int64_t head_dim() const { return d / heads; } };
}}

// The 16-bit reduction (recipe fp16, and any recipe whose reduce dtype is
// bf16/f16): the f32 unsharded gradient is cast to the reduce dtype into a
// pool block (after which the f32 buffer is given back), reduce-scattered
// (avg) in 16 bits (half the traffic of f32; with fp16 the loss scale keeps
// small gradients representable), and accumulated into the f32 gradient shard
// in the same kernel that computes the optimizer's statistics.
#include "wire_format.hpp"

#include "kshard/error.hpp"

namespace kshard::detail {
namespace {

template <class T>
class Reduce16 final : public ReduceWire {
 public:
  Request start(const ShardContext& c, const memory::Block& full, GradWrite&) override {
    const std::size_t shard = c.shard(), flat = c.flat();
    send_ = memory::acquire(2 * flat, (c.name + ".rs_send").c_str());
    recv_ = memory::acquire(2 * shard, (c.name + ".rs_recv").c_str());
    cast_from_f32<T>(full.view<float>(flat), send_.view<T>(flat));
    return c.shard_comm.reduce_scatter_async(send_.view<T>(flat), recv_.view<T>(shard),
                                             ReduceOp::avg);
  }
  // The 16-bit copy is what is sent.
  bool reads_full_until_finish() const override { return false; }

  void finish(const ShardContext& c, const memory::Block&, GradWrite write) override {
    Kokkos::View<T*> r = recv_.view<T>(c.shard());
    average_over_replicas<T>(c, r);
    accumulate_with_stats<T>(r, c.grad, c.grad_stats, write);
    // Back to the pool with the accumulation still queued (see wire_reduce_f32.cpp).
    send_.reset();
    recv_.reset();
  }

 private:
  memory::Block send_, recv_;  // the cast unsharded gradient, the reduced shard
};

}  // namespace

std::unique_ptr<ReduceWire> make_16bit_reduce(DType reduce_dtype) {
  if (reduce_dtype == DType::bf16) return std::make_unique<Reduce16<bfloat16_t>>();
  return std::make_unique<Reduce16<float16_t>>();
}

}  // namespace kshard::detail

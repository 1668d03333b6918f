// The f32 reduction (recipes fp32, bf16, fp8): the f32 unsharded gradient is
// reduce-scattered (avg) as it is, in f32, so the shard gets the exact f32
// average of the layers' f32 gradients.
//
// Three shortcuts:
// - After zero_grad() (GradWrite::assign) the reduce-scatter lands in the
//   gradient shard itself: no receive buffer, no accumulation pass.
// - One rank per shard: avg over one rank is the identity, so there is no
//   reduce-scatter at all (NCCL would copy the whole gradient: 2.3 ms of a
//   38 ms step at 536M parameters on the H200); finish() accumulates from the
//   unsharded gradient itself (the replicate all-reduce, if any, still runs).
// - One rank per shard and one replica: nothing to average at all, so the
//   layers accumulate into the gradient shard itself (accumulates_in_shard):
//   no unsharded f32 gradient buffer (two units' worth at the peak: 384 MiB
//   at 536M parameters) and no accumulation pass; finish() computes the
//   statistics only.
#include "wire_format.hpp"

namespace kshard::detail {
namespace {

class F32Reduce final : public ReduceWire {
 public:
  bool reduces_locally(const ShardContext& c) const override { return c.shard_comm.size() == 1; }
  bool accumulates_in_shard(const ShardContext& c) const override {
    return reduces_locally(c) && c.replicate_comm.size() <= 1;
  }

  Request start(const ShardContext& c, const memory::Block& full, GradWrite& write) override {
    auto sent = full.view<float>(c.flat());
    if (reduces_locally(c)) return Request();
    if (write == GradWrite::assign) {
      write = GradWrite::none;
      return c.shard_comm.reduce_scatter_async(sent, c.grad, ReduceOp::avg);
    }
    recv_ = memory::acquire(4 * c.shard(), (c.name + ".rs_recv").c_str());
    return c.shard_comm.reduce_scatter_async(sent, recv_.view<float>(c.shard()), ReduceOp::avg);
  }
  bool reads_full_until_finish() const override { return true; }

  void finish(const ShardContext& c, const memory::Block& full, GradWrite write) override {
    const std::size_t shard = c.shard();
    // What is added to (or assigned to) the shard; none when the shard holds
    // the result already (the reduce-scatter wrote it, or the layers
    // accumulated into it: accumulates_in_shard).
    Kokkos::View<float*> r;
    if (write != GradWrite::none)
      r = reduces_locally(c) ? full.view<float>(shard)  // shard == flat
                             : recv_.view<float>(shard);
    // (HSDP) the replicas' average lands where the shard's new values are.
    average_over_replicas<float>(c, write == GradWrite::none ? c.grad : r);
    // GradWrite::none: r is empty, only the shard's statistics are computed.
    accumulate_with_stats<float>(r, c.grad, c.grad_stats, write);
    // Back to the pool with the accumulation still queued: safe, because
    // every later user of the block is ordered after it (kernels on the same
    // stream; collectives wait for that stream when they start).
    recv_.reset();
  }

 private:
  memory::Block recv_;  // the reduce-scattered shard, when it is added to grad
};

}  // namespace

std::unique_ptr<ReduceWire> make_f32_reduce() { return std::make_unique<F32Reduce>(); }

}  // namespace kshard::detail

// The f32 gather (recipe fp32): the master shards travel as they are, and the
// gathered buffer IS the compute buffer (every parameter a View into it). With
// one rank per shard nothing travels: the compute buffer is the master itself.
#include "wire_format.hpp"

namespace kshard::detail {
namespace {

class F32Gather final : public GatherWire {
 public:
  void refresh(const ShardContext&) override {}  // the master is what is sent
  std::size_t persistent_bytes() const override { return 0; }

  Request start(const ShardContext& c, memory::Block& compute) override {
    if (in_place(c)) {
      // One rank per shard: the master IS the full parameters (nothing
      // writes it between unshard and reshard; the optimizer steps it after).
      compute = memory::borrow(c.master.data(), 4 * c.flat());
      return Request();
    }
    compute = memory::acquire(4 * c.flat(), (c.name + ".full").c_str());
    return c.shard_comm.all_gather_async(c.master, compute.view<float>(c.flat()));
  }
  void finish(const ShardContext&, memory::Block&) override {}
  std::size_t compute_bytes(const ShardContext& c) const override {
    return in_place(c) ? 0 : 4 * c.flat();
  }

 private:
  // One rank per shard: the master is the compute buffer itself.
  static bool in_place(const ShardContext& c) { return c.shard_comm.size() == 1; }
};

}  // namespace

std::unique_ptr<GatherWire> make_f32_gather() { return std::make_unique<F32Gather>(); }

}  // namespace kshard::detail

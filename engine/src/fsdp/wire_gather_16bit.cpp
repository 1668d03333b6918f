// The 16-bit gather (recipes bf16 and fp16): the master shards travel cast to
// bf16/f16, and the gathered buffer IS the compute buffer (the layers compute
// on the gathered values as they are, no upcast copy).
//
// What is sent: the low-precision shard kept between steps when the group was
// asked to keep one (written by the optimizer's update kernel, so an unshard
// needs no cast pass), or, FSDP2's way and the default, the master cast into a
// pool block at each unshard. With a kept shard and one rank per shard the
// unshard moves nothing: the kept shard is the compute buffer.
#include "wire_format.hpp"

namespace kshard::detail {
namespace {

template <class T>
class Gather16 final : public GatherWire {
 public:
  Gather16(const ShardContext& c, bool keep_shard) {
    if (keep_shard)
      kept_ = Kokkos::View<T*>(
          Kokkos::view_alloc(c.name + ".shard_lp", Kokkos::WithoutInitializing), c.shard());
  }

  void refresh(const ShardContext& c) override {
    if (kept_.data()) cast_from_f32<T>(c.master, kept_);
  }
  LowPrecisionShard low_precision_shard() const override {
    if (!kept_.data()) return {};
    return LowPrecisionShard(kept_);
  }
  std::size_t persistent_bytes() const override { return kept_.size() * sizeof(T); }

  Request start(const ShardContext& c, memory::Block& compute) override {
    const std::size_t shard = c.shard(), flat = c.flat();
    if (in_place(c)) {
      // One rank per shard: the kept shard IS the full parameters in the
      // compute dtype (the optimizer wrote it from the new master): no copy,
      // no cast, no pool block.
      compute = memory::borrow(kept_.data(), 2 * flat);
      return Request();
    }
    compute = memory::acquire(2 * flat, (c.name + ".full").c_str());
    Kokkos::View<const T*> src;
    if (kept_.data()) {
      src = kept_;
    } else if (c.shard_comm.size() == 1) {
      // One rank per shard: the all-gather would only copy the cast shard;
      // cast into the compute buffer instead (one pass, no send block); the
      // request is a completed one.
      cast_from_f32<T>(c.master, compute.view<T>(flat));
      return Request();
    } else {
      send_ = memory::acquire(2 * shard, (c.name + ".send_lp").c_str());
      cast_from_f32<T>(c.master, send_.view<T>(shard));
      src = send_.view<T>(shard);
    }
    return c.shard_comm.all_gather_async(src, compute.view<T>(flat));
  }
  void finish(const ShardContext&, memory::Block&) override { send_.reset(); }
  std::size_t compute_bytes(const ShardContext& c) const override {
    return in_place(c) ? 0 : 2 * c.flat();
  }

 private:
  // A kept shard with one rank per shard: it is the compute buffer itself.
  bool in_place(const ShardContext& c) const { return kept_.data() && c.shard_comm.size() == 1; }

  Kokkos::View<T*> kept_;  // the kept bf16/f16 shard, if any
  memory::Block send_;                // the cast master while a gather is in flight
};

}  // namespace

std::unique_ptr<GatherWire> make_16bit_gather(const ShardContext& c, bool keep_low_precision_shard) {
  if (c.recipe.gather_dtype == DType::bf16)
    return std::make_unique<Gather16<bfloat16_t>>(c, keep_low_precision_shard);
  return std::make_unique<Gather16<float16_t>>(c, keep_low_precision_shard);
}

}  // namespace kshard::detail

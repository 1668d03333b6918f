// The fp8 block-scaled gather (recipe fp8): each rank sends ONE packed segment
// [e4m3 values | one f32 scale per recipe.fp8_block elements] (a power-of-two
// scale per block, kernels/fp8_block.hpp), so one all-gather moves values and
// scales together; each rank's segment is then dequantized by one kernel into
// the bf16 compute buffer. Without fp8_init the segment is quantized from the
// master at each unshard; with fp8_init it is the shard as stored between
// steps (re-quantized by refresh() after each optimizer step) and is sent as
// it is.
#include "wire_format.hpp"

#include "kshard/kernels/fp8_block.hpp"

namespace kshard::detail {
namespace {

class Fp8Gather final : public GatherWire {
 public:
  explicit Fp8Gather(const ShardContext& c) {
    if (c.recipe.fp8_init)
      stored_ = Kokkos::View<std::uint8_t*>(
          Kokkos::view_alloc(c.name + ".shard_fp8", Kokkos::WithoutInitializing),
          segment_bytes(c));
  }

  void refresh(const ShardContext& c) override {
    if (c.recipe.fp8_init) pack(c, stored_.data());
  }
  std::size_t persistent_bytes() const override { return stored_.span(); }

  Request start(const ShardContext& c, memory::Block&) override {
    const std::size_t seg = segment_bytes(c);
    Kokkos::View<const std::uint8_t*> src = stored_;
    if (!c.recipe.fp8_init) {
      send_ = memory::acquire(seg, (c.name + ".fp8_send").c_str());
      pack(c, send_.data());
      src = send_.view<std::uint8_t>(seg);
    }
    const std::size_t all = seg * std::size_t(c.index.shard_size());
    gathered_ = memory::acquire(all, (c.name + ".gathered").c_str());
    return c.shard_comm.all_gather_async(src, gathered_.view<std::uint8_t>(all));
  }

  void finish(const ShardContext& c, memory::Block& compute) override {
    send_.reset();
    // Dequantize each rank's segment straight into the bf16 compute buffer.
    const std::size_t shard = c.shard();
    const std::size_t seg = segment_bytes(c);
    const std::size_t nb = fp8_num_blocks(shard, c.recipe.fp8_block);
    compute = memory::acquire(2 * c.flat(), (c.name + ".full").c_str());
    for (int r = 0; r < c.index.shard_size(); ++r) {
      const std::size_t base = std::size_t(r) * seg;
      fp8_dequantize(gathered_.view<float8_e4m3_t>(shard, base),
                     gathered_.view<float>(nb, base + shard),
                     compute.view<bfloat16_t>(shard, 2 * std::size_t(r) * shard),
                     c.recipe.fp8_block);
    }
    gathered_.reset();
  }

  std::size_t gather_bytes(const ShardContext& c) const override {
    return segment_bytes(c) * std::size_t(c.index.shard_size());
  }

 private:
  /// One rank's packed segment: the e4m3 values, then the block scales.
  static std::size_t segment_bytes(const ShardContext& c) {
    const std::size_t shard = c.shard();
    return shard + sizeof(float) * fp8_num_blocks(shard, c.recipe.fp8_block);
  }
  /// Quantizes the master into a packed segment at `packed`.
  static void pack(const ShardContext& c, std::uint8_t* packed) {
    using Unmanaged8 = Kokkos::View<float8_e4m3_t*, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    using UnmanagedF = Kokkos::View<float*, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    const std::size_t shard = c.shard();
    fp8_quantize(c.master, Unmanaged8(reinterpret_cast<float8_e4m3_t*>(packed), shard),
                 UnmanagedF(reinterpret_cast<float*>(packed + shard),
                            fp8_num_blocks(shard, c.recipe.fp8_block)),
                 c.recipe.fp8_block);
  }

  Kokkos::View<std::uint8_t*> stored_;  // fp8_init: the shard as fp8 + scales
  memory::Block send_;                  // without fp8_init: the quantized master
  memory::Block gathered_;              // every rank's segment, until dequantized
};

}  // namespace

std::unique_ptr<GatherWire> make_fp8_gather(const ShardContext& c) {
  return std::make_unique<Fp8Gather>(c);
}

}  // namespace kshard::detail

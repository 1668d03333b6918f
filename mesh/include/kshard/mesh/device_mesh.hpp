#pragma once
// DeviceMesh: the world arranged as a 1-D (FSDP) or 2-D (HSDP: "replicate" x
// "shard") grid, with a sub-communicator per dimension.
//
//   kshard::DeviceMesh mesh(session.world(), {2, 4}, {"replicate", "shard"});
//   mesh.comm("shard").all_gather(shard, full);   // 4 ranks with the same replica index
//   mesh.comm("replicate").all_reduce(grad, kshard::ReduceOp::avg);
//
// Ranks are laid out row-major (the last dimension varies fastest), so the
// shard dimension groups neighbouring ranks — on one node when ranks are
// packed by node, where the bandwidth is. A shape whose product is not the
// world size, or with a dimension < 1, is a kshard::Error on every rank
// (every rank checks the same shape; ranks that disagree on the shape are
// detected too), never a hang.
#include <string>
#include <vector>

#include "kshard/mesh/communicator.hpp"

namespace kshard {

class DeviceMesh {
 public:
  DeviceMesh(const Communicator& world, std::vector<int> shape,
             std::vector<std::string> dim_names = {});

  /// True when `shape` is a valid mesh for `world_size` ranks (no throwing).
  static bool fits(const std::vector<int>& shape, int world_size) noexcept;
  /// "[2, 4] (replicate, shard)".
  static std::string describe(const std::vector<int>& shape,
                              const std::vector<std::string>& names = {});

  int ndim() const noexcept { return int(shape_.size()); }
  const std::vector<int>& shape() const noexcept { return shape_; }
  const std::vector<std::string>& dim_names() const noexcept { return names_; }
  int dim_index(const std::string& name) const;
  /// This rank's coordinate along each dimension.
  const std::vector<int>& coords() const noexcept { return coords_; }
  int coord(int dim) const { return coords_.at(dim); }

  const Communicator& world() const noexcept { return world_; }
  const Communicator& comm(int dim) const;
  const Communicator& comm(const std::string& name) const { return comm(dim_index(name)); }
  /// The last dimension: parameters are sharded over it.
  const Communicator& shard_comm() const { return comm(ndim() - 1); }
  /// 2-D meshes: the first dimension (gradients are all-reduced over it).
  /// 1-D meshes: a (local, MPI) communicator of this rank alone. A 1-D mesh's
  /// shard communicator is the world communicator itself.
  const Communicator& replicate_comm() const;
  int shard_size() const noexcept { return shape_.back(); }
  int replicate_size() const noexcept { return ndim() == 2 ? shape_.front() : 1; }

 private:
  Communicator world_;
  std::vector<int> shape_;
  std::vector<std::string> names_;
  std::vector<int> coords_;
  std::vector<Communicator> comms_;
  Communicator self_;
};

}  // namespace kshard

#include "kshard/mesh/device_mesh.hpp"

#include <algorithm>
#include <numeric>

#include "comm_impl.hpp"
#include "kshard/mesh/agree.hpp"

namespace kshard {

bool DeviceMesh::fits(const std::vector<int>& shape, int world_size) noexcept {
  if (shape.empty() || shape.size() > 2) return false;
  long long prod = 1;
  for (int d : shape) {
    if (d < 1) return false;
    prod *= d;
  }
  return prod == world_size;
}

std::string DeviceMesh::describe(const std::vector<int>& shape,
                                 const std::vector<std::string>& names) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  s += "]";
  if (!names.empty()) {
    s += " (";
    for (std::size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
    s += ")";
  }
  return s;
}

DeviceMesh::DeviceMesh(const Communicator& world, std::vector<int> shape,
                       std::vector<std::string> dim_names)
    : world_(world), shape_(std::move(shape)), names_(std::move(dim_names)) {
  const int n = world_.size();
  if (names_.empty()) {
    names_ = shape_.size() == 2 ? std::vector<std::string>{"replicate", "shard"}
                                : std::vector<std::string>(shape_.size(), "shard");
  }
  const std::string desc = describe(shape_, names_);
  // Every rank evaluates the same conditions on the same inputs, so every
  // rank throws together; only the agreement check below communicates.
  if (shape_.empty() || shape_.size() > 2)
    throw Error("device mesh " + desc + " has " + std::to_string(shape_.size()) + " dimensions",
                "a 1-D [shard] or 2-D [replicate, shard] mesh");
  if (names_.size() != shape_.size())
    throw Error("device mesh " + desc + " names " + std::to_string(names_.size()) +
                    " dimensions for a " + std::to_string(shape_.size()) + "-D shape",
                "one name per dimension");
  if (shape_.size() == 2 && names_[0] == names_[1])
    throw Error("device mesh " + desc + " repeats the dimension name '" + names_[0] + "'",
                "distinct dimension names");
  for (int d : shape_)
    if (d < 1)
      throw Error("device mesh " + desc + " has a dimension of size " + std::to_string(d),
                  "every dimension >= 1");
  long long prod = 1;
  for (int d : shape_) prod *= d;
  if (prod != n)
    throw Error("device mesh " + desc + " needs " + std::to_string(prod) + " ranks but the world has " +
                    std::to_string(n),
                "a shape whose product is the world size " + std::to_string(n));

  // Ranks that were given different shapes would build mismatched groups and
  // hang in the splits below: agree first.
  const std::string differs =
      disagreement(world_, {{"the number of dimensions", std::int64_t(shape_.size())},
                            {"dimension 0", shape_[0]},
                            {"dimension 1", shape_.size() > 1 ? shape_[1] : 0}});
  if (!differs.empty())
    throw Error("ranks disagree on the device mesh shape (this rank: " + desc + "): " + differs,
                "the same mesh shape on every rank");

  const int r = world_.rank();
  coords_.resize(shape_.size());
  if (shape_.size() == 1) {
    coords_[0] = r;
  } else {
    coords_[0] = r / shape_[1];
    coords_[1] = r % shape_[1];
  }
  if (ndim() == 1) {
    // The one dimension spans the world: use the world itself (a split would
    // cost an ncclCommSplit per mesh on NCCL), and for the trivial replicate
    // dimension a local MPI communicator of this rank alone (no collective).
    comms_.push_back(world_);
    self_ = Communicator(detail::make_mpi_comm(MPI_COMM_SELF, world_.name() + ".self"));
    return;
  }
  // Sub-communicator of dim d: the ranks that share every other coordinate.
  for (int d = 0; d < ndim(); ++d) {
    int color = 0;
    for (int e = 0; e < ndim(); ++e)
      if (e != d) color = color * shape_[e] + coords_[e];
    comms_.push_back(world_.split(color, coords_[d], world_.name() + "." + names_[d]));
  }
}

int DeviceMesh::dim_index(const std::string& name) const {
  for (int i = 0; i < ndim(); ++i)
    if (names_[i] == name) return i;
  throw Error("device mesh " + describe(shape_, names_) + " has no dimension '" + name + "'",
              "one of its dimension names");
}

const Communicator& DeviceMesh::comm(int dim) const {
  if (dim < 0 || dim >= ndim())
    throw Error("device mesh dimension " + std::to_string(dim) + " out of range",
                "0 <= dim < " + std::to_string(ndim()));
  return comms_[dim];
}

const Communicator& DeviceMesh::replicate_comm() const { return ndim() == 2 ? comms_[0] : self_; }

}  // namespace kshard

#pragma once
// Small host-number collectives of the train target (private).
#include <exception>
#include <string>
#include <vector>

#include <Kokkos_Core.hpp>

#include "kshard/mesh/communicator.hpp"

namespace kshard::train_detail {

/// all_reduce of a few host doubles over one communicator, through a View of
/// the default memory space (which every backend accepts, NCCL included),
/// allocated once: a training step allocates nothing.
class HostReducer {
 public:
  static constexpr std::size_t kCapacity = 8;
  explicit HostReducer(Communicator comm);
  std::vector<double> run(const std::vector<double>& values, ReduceOp op) const;
  const Communicator& comm() const noexcept { return comm_; }

 private:
  Communicator comm_;
  Kokkos::View<double*> dev_;
  Kokkos::View<double*>::HostMirror host_;
};

/// Every rank of the reducer's communicator learns whether some rank failed
/// (`local` set): that rank rethrows its own exception, the others throw a
/// kshard::Error naming `what` and the first failing rank. So an error that
/// only some ranks meet (bad data in the windows they read) ends every rank
/// before the next collective could hang. Collective; returns normally when
/// no rank failed.
void agree_on_failure(const HostReducer& reducer, const std::exception_ptr& local,
                      const std::string& what);

}  // namespace kshard::train_detail

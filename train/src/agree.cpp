#include "agree.hpp"

#include "kshard/error.hpp"

namespace kshard::train_detail {

HostReducer::HostReducer(Communicator comm)
    : comm_(std::move(comm)),
      dev_("kshard.train.reduce", kCapacity),
      host_(Kokkos::create_mirror_view(dev_)) {}

std::vector<double> HostReducer::run(const std::vector<double>& values, ReduceOp op) const {
  const std::size_t n = values.size();
  if (n == 0 || n > kCapacity)
    throw Error("HostReducer::run with " + std::to_string(n) + " values",
                "1 to " + std::to_string(kCapacity));
  for (std::size_t i = 0; i < n; ++i) host_(i) = values[i];
  const auto dev = Kokkos::subview(dev_, std::make_pair(std::size_t(0), n));
  const auto host = Kokkos::subview(host_, std::make_pair(std::size_t(0), n));
  Kokkos::deep_copy(dev, host);
  comm_.all_reduce(dev, op);
  Kokkos::deep_copy(host, dev);
  std::vector<double> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = host_(i);
  return out;
}

void agree_on_failure(const HostReducer& reducer, const std::exception_ptr& local,
                      const std::string& what) {
  const Communicator& comm = reducer.comm();
  // max of (size - rank) over the failing ranks names the lowest one; 0: none.
  const double mine = local ? double(comm.size() - comm.rank()) : 0.0;
  const double top = reducer.run({mine}, ReduceOp::max)[0];
  if (local) std::rethrow_exception(local);
  if (top > 0) {
    const int first = comm.size() - int(top);
    throw Error(what + ": rank " + std::to_string(first) + " of " + comm.name() +
                    " failed (its error says why)",
                "no error on any rank");
  }
}

}  // namespace kshard::train_detail

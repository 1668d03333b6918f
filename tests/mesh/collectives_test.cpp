// Every collective x dtype x size x (blocking, async) on the world
// communicator, checked element by element against closed-form values
// (fill.hpp). One launch runs them all; the suite is registered at 2 and 4 ranks.
#include <kshard/testing/harness.hpp>

#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>

#include <cstdint>
#include <string>

#include "fill.hpp"

namespace kt = kshard::testing;
namespace bdata = boost::unit_test::data;
using kshard::ReduceOp;
using namespace kshard::test;

namespace {

enum class Op { all_gather, reduce_scatter, all_reduce, broadcast };
const char* op_name(Op o) {
  static const char* n[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast"};
  return n[int(o)];
}

struct Mismatch {
  std::int64_t count = 0;
  std::string first;
};

template <class T>
void compare(const Kokkos::View<T*>& got, Mismatch& m, double (*expected)(std::int64_t, const void*),
             const void* ctx) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), got);
  for (std::int64_t i = 0; i < std::int64_t(h.extent(0)); ++i) {
    const double want = expected(i, ctx);
    const double have = as_double(h(i));
    if (have != want) {
      if (m.count++ == 0)
        m.first = "element " + std::to_string(i) + ": got " + std::to_string(have) + ", expected " +
                  std::to_string(want);
    }
  }
}

struct Ctx {
  int P, rank, root;
  std::int64_t n;
  ReduceOp op;
};

// Runs one collective on `n` elements per rank and checks the result.
template <class T>
Mismatch run_case(Op which, ReduceOp op, std::int64_t n, bool async) {
  const auto& world = kt::world();
  const int P = world.size(), r = world.rank();
  Mismatch m;
  Ctx c{P, r, P - 1, n, op};
  switch (which) {
    case Op::all_gather: {
      Kokkos::View<T*> send("send", n), recv("recv", n * P);
      fill(send, r);
      if (async) {
        auto req = world.all_gather_async(send, recv);
        req.wait();
      } else {
        world.all_gather(send, recv);
      }
      compare(recv, m, [](std::int64_t i, const void* p) {
        const Ctx& c = *static_cast<const Ctx*>(p);
        return f(int(i / c.n), i % c.n);
      }, &c);
      break;
    }
    case Op::reduce_scatter: {
      Kokkos::View<T*> send("send", n * P), recv("recv", n);
      fill(send, r);
      if (async) {
        auto req = world.reduce_scatter_async(send, recv, op);
        req.wait();
      } else {
        world.reduce_scatter(send, recv, op);
      }
      compare(recv, m, [](std::int64_t i, const void* p) {
        const Ctx& c = *static_cast<const Ctx*>(p);
        return reduced(c.op, c.P, c.rank * c.n + i);
      }, &c);
      break;
    }
    case Op::all_reduce: {
      Kokkos::View<T*> buf("buf", n);
      fill(buf, r);
      if (async) {
        Kokkos::View<T*> out("out", n);
        auto req = world.all_reduce_async(buf, out, op);
        req.wait();
        buf = out;
      } else {
        world.all_reduce(buf, op);  // in place
      }
      compare(buf, m, [](std::int64_t i, const void* p) {
        const Ctx& c = *static_cast<const Ctx*>(p);
        return reduced(c.op, c.P, i);
      }, &c);
      break;
    }
    case Op::broadcast: {
      Kokkos::View<T*> buf("buf", n);
      fill(buf, r);
      if (async) {
        auto req = world.broadcast_async(buf, c.root);
        req.wait();
      } else {
        world.broadcast(buf, c.root);
      }
      compare(buf, m, [](std::int64_t i, const void* p) {
        const Ctx& c = *static_cast<const Ctx*>(p);
        return f(c.root, i);
      }, &c);
      break;
    }
  }
  return m;
}

const char* kDtypes[] = {"f32", "f64", "i32", "i64", "u8", "bf16", "f16"};

Mismatch dispatch(int dtype, Op which, ReduceOp op, std::int64_t n, bool async) {
  switch (dtype) {
    case 0: return run_case<float>(which, op, n, async);
    case 1: return run_case<double>(which, op, n, async);
    case 2: return run_case<std::int32_t>(which, op, n, async);
    case 3: return run_case<std::int64_t>(which, op, n, async);
    case 4: return run_case<std::uint8_t>(which, op, n, async);
    case 5: return run_case<kshard::bfloat16_t>(which, op, n, async);
    default: return run_case<kshard::float16_t>(which, op, n, async);
  }
}

// (op, reduce op) pairs: every reduction with every reducing collective.
struct OpCase {
  Op op;
  ReduceOp red;
};
const OpCase kOps[] = {{Op::all_gather, ReduceOp::sum},     {Op::broadcast, ReduceOp::sum},
                       {Op::reduce_scatter, ReduceOp::sum}, {Op::reduce_scatter, ReduceOp::avg},
                       {Op::reduce_scatter, ReduceOp::max}, {Op::reduce_scatter, ReduceOp::min},
                       {Op::all_reduce, ReduceOp::sum},     {Op::all_reduce, ReduceOp::avg},
                       {Op::all_reduce, ReduceOp::max},     {Op::all_reduce, ReduceOp::min}};
// 0, 1, an uneven size, and a few elements more than 64 MiB of f32 per rank.
const std::int64_t kSizes[] = {0, 1, 1237, (std::int64_t(64) << 20) / 4 + 3};

void check_case(int op_i, int dtype, int size_i, int async) {
  const OpCase oc = kOps[op_i];
  const std::int64_t n = kSizes[size_i];
  BOOST_TEST_MESSAGE(op_name(oc.op) << " " << kshard::reduce_op_name(oc.red) << " "
                                    << kDtypes[dtype] << " n=" << n << (async ? " async" : ""));
  const Mismatch m = dispatch(dtype, oc.op, oc.red, n, async != 0);
  KSHARD_CHECK_ALL_MSG(m.count == 0, op_name(oc.op)
                                         << "(" << kshard::reduce_op_name(oc.red) << ", "
                                         << kDtypes[dtype] << ", n=" << n
                                         << (async ? ", async" : "") << "): " << m.count
                                         << " wrong elements; first: " << m.first);
}

}  // namespace

KSHARD_TEST_SUITE(collectives)

// Sizes 0, 1 and 1237 for every op x reduction x dtype x mode.
BOOST_DATA_TEST_CASE(every_op_dtype_size, bdata::xrange(10) * bdata::xrange(7) * bdata::xrange(3) *
                                              bdata::xrange(2),
                     op_i, dtype, size_i, async) {
  check_case(op_i, dtype, size_i, async);
}

// > 64 MiB per rank: the four collectives (sum) for one 32-bit and one 16-bit
// dtype; the byte paths are the same for the others, and this host's memory
// bandwidth is small.
const int kLargeOps[] = {0, 1, 2, 6};
const int kLargeDtypes[] = {0, 5};
BOOST_DATA_TEST_CASE(large_messages, bdata::xrange(4) * bdata::xrange(2) * bdata::xrange(2), op_j,
                     dtype_j, async) {
  check_case(kLargeOps[op_j], kLargeDtypes[dtype_j], 3, async);
}

BOOST_AUTO_TEST_CASE(many_requests_in_flight_waited_out_of_order) {
  const auto& world = kt::world();
  const int P = world.size();
  constexpr int k = 4;
  std::vector<Kokkos::View<float*>> send, recv;
  std::vector<kshard::Request> reqs;
  for (int j = 0; j < k; ++j) {
    send.emplace_back("send", 100 + j);
    recv.emplace_back("recv", (100 + j) * P);
    fill(send.back(), world.rank(), j);
    reqs.push_back(world.all_gather_async(send.back(), recv.back()));
  }
  KSHARD_CHECK_ALL(kshard::collectives_in_flight() == k);
  for (int j = k - 1; j >= 0; --j) reqs[j].wait();
  KSHARD_CHECK_ALL(kshard::collectives_in_flight() == 0);
  std::int64_t bad = 0;
  for (int j = 0; j < k; ++j) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), recv[j]);
    const std::int64_t n = 100 + j;
    for (std::int64_t i = 0; i < n * P; ++i) bad += h(i) != float(f(int(i / n), j + i % n));
  }
  KSHARD_CHECK_ALL(bad == 0);
}

// Kernels of the device-ordering test (free functions: nvcc rejects extended
// lambdas inside Boost.Test bodies in some forms).
void write_pattern(Kokkos::View<float*> v, int rank, int it) {
  Kokkos::parallel_for(
      "test.write_pattern", Kokkos::RangePolicy<>(0, std::int64_t(v.extent(0))),
      KOKKOS_LAMBDA(std::int64_t i) { v(i) = float(f(rank, i % 1000) + it); });
}

// bad(0) += number of elements of recv not equal to rank r's pattern of
// iteration it, where block i / n of recv comes from rank first_rank + i / n.
void count_gather_mismatches(Kokkos::View<const float*> recv, std::int64_t n, int it,
                             Kokkos::View<std::int64_t*> bad, int first_rank = 0) {
  Kokkos::parallel_for(
      "test.count_mismatches", Kokkos::RangePolicy<>(0, std::int64_t(recv.extent(0))),
      KOKKOS_LAMBDA(std::int64_t i) {
        const int r = first_rank + int(i / n);
        if (recv(i) != float(f(r, (i % n) % 1000) + it)) Kokkos::atomic_add(&bad(0), std::int64_t(1));
      });
}

// Each iteration's input is written by a kernel right before the call, the
// result is read by a kernel right after Request::wait_on_device() with no
// fence, and the next iteration overwrites the input at once: correct only
// if the backend orders its collective after the first kernel and the
// second kernel after the collective (NCCL: its own stream and two events).
BOOST_AUTO_TEST_CASE(wait_on_device_orders_kernels_around_collectives) {
  const auto& world = kt::world();
  const int P = world.size();
  const std::int64_t n = std::int64_t(1) << 20;  // big enough for a race to show
  Kokkos::View<float*> send("send", std::size_t(n)), recv("recv", std::size_t(n * P));
  Kokkos::View<std::int64_t*> bad("bad", 1);
  for (int it = 0; it < 8; ++it) {
    write_pattern(send, world.rank(), it);
    kshard::Request req = world.all_gather_async(send, recv);
    req.wait_on_device();
    count_gather_mismatches(recv, n, it, bad);
  }
  KSHARD_CHECK_ALL(kshard::collectives_in_flight() == 0);
  // A reduce-scatter of the gathered buffer (every block equal over ranks
  // up to the rank term) into a View the next iteration overwrites.
  Kokkos::View<float*> part("part", std::size_t(n));
  Kokkos::View<std::int64_t*> bad_rs("bad_rs", 1);
  for (int it = 0; it < 4; ++it) {
    write_pattern(send, world.rank(), it);
    world.all_gather(send, recv);  // blocking: complete on return
    kshard::Request req = world.reduce_scatter_async(recv, part, ReduceOp::max);
    req.wait_on_device();
    // max over ranks of block `rank` of recv = rank's own pattern on every rank.
    count_gather_mismatches(part, n, it, bad_rs, world.rank());
  }
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), bad);
  auto h_rs = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), bad_rs);
  KSHARD_CHECK_ALL(h(0) == 0);
  KSHARD_CHECK_ALL(h_rs(0) == 0);
}

BOOST_AUTO_TEST_CASE(broadcast_from_every_root) {
  const auto& world = kt::world();
  std::int64_t bad = 0;
  for (int root = 0; root < world.size(); ++root) {
    Kokkos::View<double*> buf("buf", 33);
    fill(buf, world.rank());
    world.broadcast(buf, root);
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), buf);
    for (int i = 0; i < 33; ++i) bad += h(i) != f(root, i);
  }
  KSHARD_CHECK_ALL(bad == 0);
}

BOOST_AUTO_TEST_CASE(in_place_all_gather_from_own_block) {
  const auto& world = kt::world();
  const int P = world.size();
  const std::int64_t n = 17;
  Kokkos::View<float*> full("full", n * P);
  auto own = Kokkos::subview(full, std::make_pair(world.rank() * n, (world.rank() + 1) * n));
  Kokkos::View<float*> tmp("tmp", n);
  fill(tmp, world.rank());
  Kokkos::deep_copy(own, tmp);
  world.all_gather(own, full);
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), full);
  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < n * P; ++i) bad += h(i) != float(f(int(i / n), i % n));
  KSHARD_CHECK_ALL(bad == 0);
}

BOOST_AUTO_TEST_CASE(trace_records_collectives) {
  const auto& world = kt::world();
  Kokkos::View<float*> a("a", 8), b("b", 8 * world.size());
  world.all_gather(a, b);
  world.all_reduce(a, ReduceOp::sum);
  const auto t = world.trace();
  KSHARD_REQUIRE_ALL(t.size() >= 2);
  const auto& last = t.back();
  const auto& prev = t[t.size() - 2];
  KSHARD_CHECK_ALL(std::string(last.op) == "all_reduce" && last.bytes == 32 && last.finished_s >= 0);
  KSHARD_CHECK_ALL(std::string(prev.op) == "all_gather" && prev.seq + 1 == last.seq);
  KSHARD_CHECK_ALL(kshard::format_all_traces().find(world.name() + "#") != std::string::npos);
}

KSHARD_TEST_SUITE_END()

// kshard collectives vs the same operation called on MPI directly, on the
// same buffers, side by side in one run. Prints algorithm bandwidth (bytes of
// the larger buffer / time) and the ratio kshard / MPI for each op and size.
//
//   mpiexec -n 2 kshard-bench-collectives [--max-mib 64] [--reps 10]
//
// On host builds both sides see host memory. On CUDA builds kshard works on
// device Views (MPI backend: staged through pinned host memory; NCCL backend
// when selected) while raw MPI works on host memory, its best case.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <kshard/mesh/mpi_interop.hpp>
#include <kshard/mesh/session.hpp>

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class F>
double time_it(F&& f, int reps, MPI_Comm comm) {
  f();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    MPI_Barrier(comm);
    const double t0 = MPI_Wtime();
    f();
    double dt = MPI_Wtime() - t0, worst = 0;
    MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, comm);
    t.push_back(worst);
  }
  return median(t);
}

}  // namespace

int main(int argc, char** argv) {
  int max_mib = 64, reps = 10;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--max-mib") && i + 1 < argc) max_mib = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
  }
  kshard::Session session(argc, argv);
  const auto& comm = session.world();
  // Measure the data path with validation off; the "checked" column repeats
  // kshard with the default cross-rank validation (one small allreduce) on.
  const int P = comm.size(), r = comm.rank();
  MPI_Comm raw = MPI_COMM_WORLD;
  if (r == 0)
    std::printf("# %d ranks, backend %s, median of %d reps\n# %-15s %10s %12s %12s %7s %14s\n", P,
                kshard::backend_name(comm.backend()), reps, "op", "bytes/rank", "kshard GB/s",
                "MPI GB/s", "ratio", "checked ratio");
  for (std::size_t bytes = 1024; bytes <= (std::size_t(max_mib) << 20); bytes *= 8) {
    const std::size_t n = bytes / sizeof(float);
    Kokkos::View<float*> send("send", n), recv("recv", n * P), big("big", n * P), small("small", n);
    std::vector<float> hs(n, 1.f), hr(n * P), hb(n * P, 1.f), hsm(n);
    struct Row {
      const char* op;
      double k, m;
      double moved;
      double checked;
    };
    std::vector<Row> rows;
    auto ag = [&] { comm.all_gather(send, recv); };
    auto rs = [&] { comm.reduce_scatter(big, small, kshard::ReduceOp::sum); };
    auto ar = [&] { comm.all_reduce(send, small, kshard::ReduceOp::sum); };
    comm.set_validation(true);
    const double ag_v = time_it(ag, reps, raw), rs_v = time_it(rs, reps, raw),
                 ar_v = time_it(ar, reps, raw);
    comm.set_validation(false);
    rows.push_back({"all_gather",
                    time_it(ag, reps, raw),
                    time_it([&] { MPI_Allgather(hs.data(), int(n), MPI_FLOAT, hr.data(), int(n), MPI_FLOAT, raw); }, reps, raw),
                    double(n * P * sizeof(float)), ag_v});
    rows.push_back({"reduce_scatter",
                    time_it(rs, reps, raw),
                    time_it([&] { MPI_Reduce_scatter_block(hb.data(), hsm.data(), int(n), MPI_FLOAT, MPI_SUM, raw); }, reps, raw),
                    double(n * P * sizeof(float)), rs_v});
    rows.push_back({"all_reduce",
                    time_it(ar, reps, raw),
                    time_it([&] { MPI_Allreduce(hs.data(), hsm.data(), int(n), MPI_FLOAT, MPI_SUM, raw); }, reps, raw),
                    double(n * sizeof(float)), ar_v});
    if (r == 0)
      for (const Row& row : rows)
        std::printf("  %-15s %10zu %12.3f %12.3f %7.2f %14.2f\n", row.op, bytes,
                    row.moved / row.k / 1e9, row.moved / row.m / 1e9, row.m / row.k,
                    row.m / row.checked);
  }
  return 0;
}

// kshard-bench-checkpoint: what do sharded checkpoints cost next to plain file I/O?
//
//   mpiexec -n 2 kshard-bench-checkpoint [--params N] [--layers L] [--reps R]
//                                        [--dir DIR] [--mesh RxS]
//
// A model of L Linear(d, d) units (d from N params; fp32, FusedAdam with f32
// moments: 12 B/param saved, no padding) is saved and loaded R times. Side by
// side in the same run and directory, each rank writes the same number of
// bytes as its checkpoint data file into a plain file (write + fsync, as the
// checkpoint does) and reads as many bytes as its load reads back (pread into
// a host buffer that exists already, as a model's memory would). Figures
// are GB/s per rank: this rank's bytes over the slowest rank's time (a
// collective save is as fast as its slowest rank), median of R. Load reads
// what was just written, so both reads come from the page cache (dropping it
// needs privileges this machine's sessions may lack); the write figures
// include fsync, so they are the device's.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <kshard/checkpoint/checkpoint.hpp>
#include <kshard/engine/nn/linear.hpp>
#include <kshard/mesh/mpi_interop.hpp>
#include <kshard/mesh/session.hpp>

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double max_over(MPI_Comm c, double x) {
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_MAX, c);
  return x;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void die(const std::string& what) {
  std::fprintf(stderr, "kshard-bench-checkpoint: %s\n", what.c_str());
  MPI_Abort(MPI_COMM_WORLD, 2);
}

void plain_write(const fs::path& p, const std::vector<char>& buf) {
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) die("cannot create " + p.string());
  std::size_t done = 0;
  while (done < buf.size()) {
    const ssize_t w = ::write(fd, buf.data() + done, buf.size() - done);
    if (w <= 0) die("cannot write " + p.string());
    done += std::size_t(w);
  }
  if (::fsync(fd) != 0) die("cannot fsync " + p.string());
  ::close(fd);
}

void plain_read(const fs::path& p, std::vector<char>& buf) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) die("cannot open " + p.string());
  std::size_t done = 0;
  while (done < buf.size()) {
    const ssize_t r = ::pread(fd, buf.data() + done, buf.size() - done, off_t(done));
    if (r <= 0) die("cannot read " + p.string());
    done += std::size_t(r);
  }
  ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  kshard::Session session(argc, argv);
  std::int64_t params = 32'000'000;
  int layers = 8, reps = 3;
  std::string dir_arg, mesh_arg;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value after " + a);
      return argv[++i];
    };
    if (a == "--params") params = std::stoll(next());
    else if (a == "--layers") layers = std::stoi(next());
    else if (a == "--reps") reps = std::stoi(next());
    else if (a == "--dir") dir_arg = next();
    else if (a == "--mesh") mesh_arg = next();
    else die("unknown option " + a + " (--params N --layers L --reps R --dir DIR --mesh RxS)");
  }
  const kshard::Communicator& world = session.world();
  const MPI_Comm comm = kshard::mpi_comm(world);
  const int rank = world.rank();
  std::vector<int> shape{world.size()};
  if (!mesh_arg.empty()) shape = {std::stoi(mesh_arg), std::stoi(mesh_arg.substr(mesh_arg.find('x') + 1))};
  const kshard::DeviceMesh mesh = shape.size() == 2
                                      ? kshard::DeviceMesh(world, shape, {"replicate", "shard"})
                                      : kshard::DeviceMesh(world, shape, {"shard"});
  const std::int64_t d = std::max<std::int64_t>(1, std::int64_t(std::sqrt(double(params) / layers)));
  std::vector<kshard::LayerDef> defs;
  for (int l = 0; l < layers; ++l) defs.push_back(kshard::layer<kshard::Linear>(d, d, false));
  kshard::FsdpModel model(mesh, defs, kshard::Recipe::parse("fp32"));
  model.init_parameters(1);
  kshard::FusedAdam adam(kshard::AdamOptions{}, mesh.shard_comm(), mesh.world());
  for (std::size_t i = 0; i < model.num_units(); ++i)
    adam.add_group(model.group(i));

  const fs::path dir = dir_arg.empty() ? fs::path("kshard-bench-checkpoint.tmp") : fs::path(dir_arg);
  if (rank == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir / "plain");
  }
  MPI_Barrier(comm);

  std::vector<double> t_save, t_write, t_load, t_read, t_fresh;
  std::uint64_t mine = 0, total = 0, read_bytes = 0;
  std::vector<char> buf;
  for (int r = 0; r < reps; ++r) {
    MPI_Barrier(comm);
    auto t0 = Clock::now();
    const kshard::SaveInfo si = kshard::save_checkpoint(dir / "ckpt", r, model, adam);
    t_save.push_back(max_over(comm, seconds_since(t0)));
    mine = si.bytes_written;
    total = si.total_bytes;
    // The same bytes through plain write + fsync (ranks that write nothing
    // under HSDP write nothing here either).
    buf.assign(mine, char(r + 1));
    const fs::path plain = dir / "plain" / ("rank-" + std::to_string(rank) + ".bin");
    MPI_Barrier(comm);
    t0 = Clock::now();
    if (mine) plain_write(plain, buf);
    t_write.push_back(max_over(comm, seconds_since(t0)));

    MPI_Barrier(comm);
    t0 = Clock::now();
    const kshard::LoadInfo li = kshard::load_checkpoint(si.path, model, adam);
    t_load.push_back(max_over(comm, seconds_since(t0)));
    read_bytes = li.bytes_read;
    // The same number of bytes through pread, from the plain file of the
    // writer of this rank's shard (HSDP: every replica reads, as load does).
    std::vector<char> rbuf(read_bytes);
    const int writer = mesh.coord(mesh.ndim() - 1);
    MPI_Barrier(comm);
    t0 = Clock::now();
    if (read_bytes) plain_read(dir / "plain" / ("rank-" + std::to_string(writer) + ".bin"), rbuf);
    t_read.push_back(max_over(comm, seconds_since(t0)));
    // The same into memory allocated for it (page faults included), as load's
    // host staging is (load stages everything before it changes the model).
    MPI_Barrier(comm);
    t0 = Clock::now();
    if (read_bytes) {
      std::vector<char> fresh(read_bytes);
      plain_read(dir / "plain" / ("rank-" + std::to_string(writer) + ".bin"), fresh);
    }
    t_fresh.push_back(max_over(comm, seconds_since(t0)));
    if (rank == 0) fs::remove_all(si.path);
    MPI_Barrier(comm);
  }
  const double gb = 1e9;
  const double save = double(mine) / gb / median(t_save), write = double(mine) / gb / median(t_write);
  const double load = double(read_bytes) / gb / median(t_load), read = double(read_bytes) / gb / median(t_read);
  if (rank == 0) {
    std::printf("kshard-bench-checkpoint: %d ranks, mesh %s, %lld params (%d x Linear(%lld, %lld)), "
                "%.1f MB saved in all, %.1f MB by rank 0, median of %d\n",
                world.size(), kshard::DeviceMesh::describe(shape).c_str(),
                (long long)model.num_parameters(), layers, (long long)d, (long long)d, double(total) / 1e6,
                double(mine) / 1e6, reps);
    std::printf("  save  %.3f s  %.2f GB/s/rank   vs plain write+fsync %.3f s  %.2f GB/s/rank  (ratio %.2f)\n",
                median(t_save), save, median(t_write), write, save / write);
    std::printf("  load  %.3f s  %.2f GB/s/rank   vs plain pread       %.3f s  %.2f GB/s/rank  (ratio %.2f)\n",
                median(t_load), load, median(t_read), read, load / read);
    std::printf("        plain pread into new (zeroed) memory %.3f s  %.2f GB/s/rank\n", median(t_fresh),
                double(read_bytes) / gb / median(t_fresh));
    std::printf("BENCH {\"ranks\": %d, \"params\": %lld, \"bytes_per_rank\": %llu, \"save_gbps\": %.3f, "
                "\"plain_write_gbps\": %.3f, \"load_gbps\": %.3f, \"plain_read_gbps\": %.3f}\n",
                world.size(), (long long)model.num_parameters(), (unsigned long long)mine, save, write,
                load, read);
  }
  MPI_Barrier(comm);
  if (rank == 0) fs::remove_all(dir);
  return 0;
}

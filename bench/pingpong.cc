// relaxcc-pingpong: round trips and transfer rates between ranks 0 and 1,
// for relaxcc-hosts' latency test (bench/test_hosts_latency.py).
//
// Usage: relaxcc-pingpong SMALL_BYTES ITERS BIG_BYTES BIG_ITERS
// Rank 0 measures ITERS round trips of SMALL_BYTES each way (after one
// warm-up), then BIG_ITERS transfers of BIG_BYTES to rank 1, each answered
// by SMALL_BYTES (after one warm-up, which also opens TCP's window). It
// prints one JSON line: the median and minimum round trip, the median
// transfer time, and the transfer rate with the median round trip taken out
// (the time the link spent on the bytes). Ranks above 1 only wait.

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc != 5 || size < 2) {
    if (rank == 0)
      std::fprintf(stderr,
                   "usage: relaxcc-pingpong SMALL_BYTES ITERS BIG_BYTES BIG_ITERS (2+ ranks)\n");
    MPI_Finalize();
    return 2;
  }
  const long small = std::atol(argv[1]), iters = std::atol(argv[2]);
  const long big = std::atol(argv[3]), big_iters = std::atol(argv[4]);
  if (small < 1 || iters < 1 || big < 1 || big_iters < 1) {
    if (rank == 0) std::fprintf(stderr, "relaxcc-pingpong: every argument must be positive\n");
    MPI_Finalize();
    return 2;
  }
  std::vector<char> buf(static_cast<size_t>(std::max(small, big)), static_cast<char>(rank));
  std::vector<double> rtts, transfers;
  if (rank <= 1) {
    const int peer = 1 - rank;
    for (long i = 0; i <= iters; ++i) {
      const double t0 = MPI_Wtime();
      if (rank == 0) {
        MPI_Send(buf.data(), static_cast<int>(small), MPI_CHAR, peer, 0, MPI_COMM_WORLD);
        MPI_Recv(buf.data(), static_cast<int>(small), MPI_CHAR, peer, 0, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
      } else {
        MPI_Recv(buf.data(), static_cast<int>(small), MPI_CHAR, peer, 0, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
        MPI_Send(buf.data(), static_cast<int>(small), MPI_CHAR, peer, 0, MPI_COMM_WORLD);
      }
      if (i > 0) rtts.push_back(MPI_Wtime() - t0);
    }
    for (long i = 0; i <= big_iters; ++i) {
      const double t0 = MPI_Wtime();
      if (rank == 0) {
        MPI_Send(buf.data(), static_cast<int>(big), MPI_CHAR, peer, 1, MPI_COMM_WORLD);
        MPI_Recv(buf.data(), static_cast<int>(small), MPI_CHAR, peer, 1, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
      } else {
        MPI_Recv(buf.data(), static_cast<int>(big), MPI_CHAR, peer, 1, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
        MPI_Send(buf.data(), static_cast<int>(small), MPI_CHAR, peer, 1, MPI_COMM_WORLD);
      }
      if (i > 0) transfers.push_back(MPI_Wtime() - t0);
    }
  }
  if (rank == 0) {
    const double rtt = median(rtts), transfer = median(transfers);
    const double rtt_min = *std::min_element(rtts.begin(), rtts.end());
    std::printf(
        "{\"small_bytes\": %ld, \"rtt_us\": %.1f, \"rtt_min_us\": %.1f, \"big_bytes\": %ld, "
        "\"transfer_ms\": %.3f, "
        "\"raw_mbit\": %.1f, \"rate_mbit\": %.1f}\n",
        small, rtt * 1e6, rtt_min * 1e6, big, transfer * 1e3, big * 8 / transfer / 1e6,
        big * 8 / std::max(transfer - rtt, 1e-9) / 1e6);
    std::fflush(stdout);
  }
  MPI_Finalize();
  return 0;
}

// The nccl-tests style sweep that the collective modes of relaxcc-bench share:
// sizes from -b to -e, implementations under test taking turns iteration by
// iteration, a table row (and a JSON row) per size and implementation.
//
// Time per size is the median over iterations on each rank, then the maximum
// over ranks. Implementations take turns iteration by iteration, so that
// each sees the same spells of machine noise (on a shared VM, steal time
// comes and goes in bursts of milliseconds). Before each iteration a case
// rewrites its input (SweepCase::reset): every implementation then starts
// from data this rank just wrote, as a gradient fresh from backward, and not
// from the cache state the previous implementation left (which rank last
// wrote which chunk moved in-place times by up to 1.8x with the order of
// --impl). algbw = bytes / time; busbw = algbw * the collective's bus factor.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"

namespace relaxcc::bench {

struct SweepArgs {
  std::string min_bytes = "1K", max_bytes = "64M";
  int factor = 2;
  int iters = 20, warmup = 5;
  int check = 1;
  std::string dtype = "f32";
  std::vector<std::string> impls{"mpi"};
  std::string json;
  std::string transport = "mpi";
};

// Adds -b/-e/-f/-n/-w/-c/-d, --impl (described by `impl_help`), --json and --transport,
// after the mode's own options: every option but --impl takes its last value
// (scripts pass defaults, users append).
void add_sweep_options(CLI::App* sub, SweepArgs& args, const std::string& impl_help);

// One implementation at one size: the call to time, a check that refills
// the buffers, runs once and returns this rank's wrong elements, and a reset
// run (untimed) before every iteration.
struct SweepCase {
  std::function<void()> run;
  std::function<int64_t()> check;
  std::function<void()> reset;
};

struct SweepImpl {
  std::string name;
  std::function<std::string(int64_t bytes)> algo;  // the algorithm used at a size
  std::function<SweepCase(int64_t count, DType dtype)> prepare;
  bool in_place = false;  // the output is the input (nccl-tests' in-place columns)
};

struct SweepCollective {
  const char* mode;   // "allreduce", the JSON rows' "mode"
  std::string redop;  // the table's redop column ("none" without one)
  double bus_factor;  // busbw / algbw
};

void run_sweep(const SweepArgs& args, BenchWorld& world, const SweepCollective& collective,
               const std::vector<SweepImpl>& impls);

}  // namespace relaxcc::bench

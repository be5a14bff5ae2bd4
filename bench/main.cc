// relaxcc-bench: nccl-tests style benchmarks of relaxcc against baselines
// measured in the same run. The mode is a subcommand:
//   relaxcc-bench allreduce -b 1K -e 64M -f 2 --impl relaxcc,mpi
//   relaxcc-bench --print-config
#include <mpi.h>

#include <cstdio>
#include <iostream>

#include "modes.h"
#include "relaxcc/errors.h"
#include "relaxcc/tunables.h"
#include "relaxcc/version.h"

namespace {

void print_config() {
  const auto infos = relaxcc::Tunables::from_env().describe();
  std::printf("relaxcc %s\n", relaxcc::build_description().c_str());
  for (const auto& t : infos) {
    std::printf("%s=%s%s\n    %s (%s, default '%s', %s)\n", t.env_name.c_str(), t.value.c_str(),
                t.from_env ? "   [from the environment]" : "", t.doc.c_str(), t.type.c_str(),
                t.default_value.c_str(), t.agree ? "must agree across ranks" : "per rank");
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"relaxcc-bench: relaxcc collectives against baselines in the same run"};
  bool show_config = false;
  app.add_flag("--print-config", show_config, "List every RELAXCC_* tunable and exit");
  relaxcc::bench::add_allreduce_mode(app);
  relaxcc::bench::add_allgather_mode(app);
  relaxcc::bench::add_reduce_scatter_mode(app);
  relaxcc::bench::add_kernels_mode(app);
  relaxcc::bench::add_overlap_mode(app);
  relaxcc::bench::add_primitives_mode(app);
  relaxcc::bench::add_algorithms_mode(app);
  relaxcc::bench::add_straggler_mode(app);
  app.require_subcommand(0, 1);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const relaxcc::Error& e) {
    // A program, not the library: end the whole job so no rank waits forever.
    std::fprintf(stderr, "relaxcc-bench: %s\n", e.what());
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  if (show_config) {
    print_config();
    return 0;
  }
  if (app.get_subcommands().empty()) {
    std::cout << app.help();
    return 1;
  }
  return 0;
}

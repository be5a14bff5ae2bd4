#include "relaxcc/launch.h"

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string_view>

#include "relaxcc/errors.h"

namespace relaxcc {
namespace {

// The value of `name`, or nullptr when unset or empty.
const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// The first variable of `names` that is set, read as an integer of [lo,
// INT32_MAX - 1] into `out` (its name into `variable`, when given). A value
// that does not parse: InvalidArgument naming it when `strict`, else the
// variable counts as unset.
void first_set(std::initializer_list<const char*> names, int lo, bool strict, int& out,
               std::string* variable = nullptr) {
  for (const char* name : names) {
    const char* v = env(name);
    if (v == nullptr) continue;
    const std::string_view s(v);
    int64_t value = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    const bool ok =
        ec == std::errc() && end == s.data() + s.size() && value >= lo && value <= INT32_MAX - 1;
    if (!ok && !strict) continue;
    RELAXCC_ENFORCE(ok, InvalidArgument, name, "='", s, "' is not an integer in [", lo, ", ",
                    INT32_MAX - 1, "]");
    out = static_cast<int>(value);
    if (variable != nullptr) *variable = name;
    return;
  }
}

LaunchEnvironment read_launch(bool strict) {
  LaunchEnvironment l;
  if (env("OMPI_COMM_WORLD_RANK") || env("OMPI_COMM_WORLD_SIZE") || env("PMIX_RANK") ||
      env("PMI_RANK"))
    l.launcher = Launcher::mpi;
  else if (env("RANK") || env("WORLD_SIZE"))
    l.launcher = Launcher::torchrun;
  else if (env("SLURM_PROCID"))
    l.launcher = Launcher::srun;
  // The launcher's own variables first (a RANK left in the environment of
  // an mpirun job does not override MPI's rank).
  if (l.launcher == Launcher::mpi) {
    first_set({"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "RANK", "SLURM_PROCID"}, 0, strict,
              l.rank, &l.rank_variable);
    first_set({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE", "SLURM_NTASKS"}, 1, strict, l.size,
              &l.size_variable);
  } else {
    first_set({"RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}, 0, strict,
              l.rank, &l.rank_variable);
    first_set({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}, 1, strict, l.size,
              &l.size_variable);
  }
  first_set({"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}, 0, strict, l.local_rank);
  return l;
}

}  // namespace

const char* launcher_name(Launcher l) noexcept {
  switch (l) {
    case Launcher::mpi:
      return "mpi";
    case Launcher::torchrun:
      return "torchrun";
    case Launcher::srun:
      return "srun";
    case Launcher::none:
      break;
  }
  return "none";
}

LaunchEnvironment LaunchEnvironment::from_env() {
  return read_launch(true);
}

// Here, not in errors.cc: an Error's constructor calls it, so it reads the
// variables without throwing (one that does not parse counts as unset).
int process_rank() noexcept {
  static const int rank = read_launch(false).rank;
  return rank;
}

}  // namespace relaxcc

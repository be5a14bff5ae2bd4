#include "src/engine/polling.h"

#include <mpi.h>

#include <algorithm>

#include "relaxcc/errors.h"

namespace relaxcc::engine {

bool mpi_yields_when_idle() {
  // The tool interface's thread level is the process's (Open MPI records the
  // level asked for here as MPI's own).
  int level = MPI_THREAD_SINGLE, provided = 0;
  MPI_Query_thread(&level);
  if (MPI_T_init_thread(level, &provided) != MPI_SUCCESS) return false;
  bool yields = false;
  int index = -1;
  if (MPI_T_cvar_get_index("mpi_yield_when_idle", &index) == MPI_SUCCESS) {
    MPI_T_cvar_handle handle;
    int count = 0;
    if (MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS) {
      // A bool or an int variable: read into zeroed room for either.
      std::array<int64_t, 8> value{};
      if (count == 1 && MPI_T_cvar_read(handle, value.data()) == MPI_SUCCESS)
        yields = std::any_of(value.begin(), value.end(), [](int64_t v) { return v != 0; });
      MPI_T_cvar_handle_free(&handle);
    }
  }
  MPI_T_finalize();
  return yields;
}

Engine::Polling choose_polling(const std::string& policy, bool shared) {
  RELAXCC_ENFORCE(policy == "auto" || policy == "sleep" || policy == "yield", InvalidArgument,
                  "RELAXCC_ENGINE_POLL='", policy, "': expected auto, sleep or yield");
  Engine::Polling polling;
  const bool yield = policy == "yield" || (policy == "auto" && !shared);
  polling.backoff = yield ? Engine::Backoff::yield : Engine::Backoff::sleep;
  return polling;
}

}  // namespace relaxcc::engine

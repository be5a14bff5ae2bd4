#include "polling.h"

#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <bit>
#include <fstream>
#include <sstream>

#include "relaxcc/errors.h"

namespace relaxcc::mpi {

CpuMask own_cpu_mask() {
  CpuMask out{};
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) {
    out.fill(~uint64_t{0});
    return out;
  }
  for (size_t cpu = 0; cpu < out.size() * 64 && cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set)) out[cpu / 64] |= uint64_t{1} << (cpu % 64);
  return out;
}

namespace {
// The process's cgroup path for `controller` ("" for cgroup v2's unified
// hierarchy), from /proc/self/cgroup lines "id:controllers:path".
std::string cgroup_path(const std::string& controller) {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const bool match =
        controller.empty()
            ? controllers.empty()
            : ("," + controllers + ",").find("," + controller + ",") != std::string::npos;
    if (match) return line.substr(b + 1);
  }
  return {};
}

// Quota over period from the first readable file pair; 0 when unlimited.
double read_limit(const std::vector<std::string>& dirs, bool v2) {
  for (const std::string& dir : dirs) {
    if (v2) {
      std::ifstream in(dir + "/cpu.max");
      std::string quota;
      double period = 0;
      if (!(in >> quota >> period)) continue;
      if (quota == "max" || period <= 0) return 0;
      return std::stod(quota) / period;
    }
    std::ifstream q(dir + "/cpu.cfs_quota_us"), p(dir + "/cpu.cfs_period_us");
    double quota = 0, period = 0;
    if (!(q >> quota) || !(p >> period)) continue;
    return quota > 0 && period > 0 ? quota / period : 0;
  }
  return 0;
}
}  // namespace

double cgroup_cpu_limit() {
  // Inside a container the process's own cgroup is usually the root of its
  // view: try the path it names, then the root.
  const std::string v2 = cgroup_path("");
  if (double l = read_limit({"/sys/fs/cgroup" + v2, "/sys/fs/cgroup"}, true); l > 0) return l;
  const std::string v1 = cgroup_path("cpu");
  for (const char* root : {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"})
    if (double l = read_limit({root + v1, root}, false); l > 0) return l;
  return 0;
}

bool shares_cpus(const std::vector<CpuMask>& masks, size_t me, double cpu_limit) {
  RELAXCC_ENFORCE_LT(me, masks.size(), InternalError, "shares_cpus: rank out of range");
  if (cpu_limit > 0 && static_cast<double>(masks.size()) > cpu_limit) return true;
  const auto overlap = [](const CpuMask& a, const CpuMask& b) {
    for (size_t w = 0; w < a.size(); ++w)
      if (a[w] & b[w]) return true;
    return false;
  };
  CpuMask spanned{};
  size_t ranks = 0;
  for (const CpuMask& m : masks) {
    if (!overlap(m, masks[me])) continue;
    ++ranks;
    for (size_t w = 0; w < m.size(); ++w) spanned[w] |= m[w];
  }
  size_t cpus = 0;
  for (uint64_t w : spanned) cpus += static_cast<size_t>(std::popcount(w));
  return ranks > cpus;
}

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

}  // namespace relaxcc::mpi

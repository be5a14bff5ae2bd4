// relaxcc-bench modes. Each mode adds one CLI11 subcommand and runs when it
// is chosen. MPI is initialized (MPI_THREAD_MULTIPLE) before a mode runs.
#pragma once

#include <CLI/CLI.hpp>

namespace relaxcc::bench {

// `relaxcc-bench allreduce`: nccl-tests style sweep over implementations.
void add_allreduce_mode(CLI::App& app);
// `relaxcc-bench allgather`: the same sweep for allgather.
void add_allgather_mode(CLI::App& app);
// `relaxcc-bench reduce_scatter`: the same sweep for reduce-scatter.
void add_reduce_scatter_mode(CLI::App& app);
// `relaxcc-bench kernels`: compression kernels against memcpy and nth_element.
void add_kernels_mode(CLI::App& app);
// `relaxcc-bench overlap`: the Reducer's overlap of communication and backward.
void add_overlap_mode(CLI::App& app);
// `relaxcc-bench primitives`: gossip, CHOCO, Moshpit and async averaging.
void add_primitives_mode(CLI::App& app);
// `relaxcc-bench algorithms`: bytes and time per step of every algorithm module.
void add_algorithms_mode(CLI::App& app);
// `relaxcc-bench straggler`: the relaxations with a straggler slow from its first step.
void add_straggler_mode(CLI::App& app);

}  // namespace relaxcc::bench

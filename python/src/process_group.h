// ProcessGroupRelaxcc: the torch.distributed backend "relaxcc" (python/relaxcc
// registers it), every c10d collective on a relaxcc Communicator.
//
// One class for both torch generations (torch-ccl's pattern): it derives
// from c10d::ProcessGroup on torch 1.x, where the ProcessGroup itself runs
// the collectives, and from c10d::Backend on torch 2.x, where a dispatcher
// routes ProcessGroup calls to backends. Only torch 1.13 is built and
// tested here.
//
// Communicators. The group that init_process_group creates makes (or, for a
// group of the default group's ranks, reuses) the family's world
// communicator; every other group (new_group) is a relaxcc group of that
// world communicator (Communicator::group, no split, no communication).
// c10d's creation callback does not say which ranks a group has, so each
// member publishes its world rank in the group's c10d store and reads the
// others' back: the store a group is given is where its members meet. The
// world communicator comes from a CommunicatorFactory given the same store:
// the MPI wing's over MPI_COMM_WORLD (processes started by mpirun), or the
// UCX wing's, which exchanges its worker addresses through that store
// (processes started by torchrun or any launcher that gives c10d a store).
//
// Tensors: CPU tensors of any dtype move (as bytes); reductions take the
// dtypes relaxcc reduces (f32, f64, f16, bf16, i32, i64, u8) and the ops it
// has (SUM, AVG, MIN, MAX): any other dtype or op throws Unsupported naming
// it. Non-contiguous tensors are copied into contiguous ones and the results
// copied back when the operation completes. CUDA tensors (a build with the
// NCCL communicator) run on an NCCL communicator per device, created on the
// group's first operation on that device (collective: every member's first
// CUDA operation on the group names the same device order) with the group's
// communicator as its bootstrap, on CUDA's legacy default stream; without
// NCCL they throw Unsupported. Not exercised here (Debian's torch has no
// CUDA).
//
// Work: wait() with no timeout waits for the group's timeout (that of
// init_process_group or new_group); a wait that expires throws relaxcc's
// Timeout and poisons the group's communicator (communicator.h). getFuture()
// is completed by relaxcc's completion callback on the thread that completes
// the operation (no polling thread); it holds the output tensors.
#pragma once

#include <torch/version.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "relaxcc/communicator.h"
#include "relaxcc/store.h"

namespace relaxcc::python {

#if TORCH_VERSION_MAJOR >= 2
using BackendBase = ::c10d::Backend;
#else
using BackendBase = ::c10d::ProcessGroup;
#endif

// The world communicator of a process, created collectively by every rank
// that creates the default group. `store` is that group's c10d store.
using CommunicatorFactory = std::function<CommunicatorPtr(
    const c10::intrusive_ptr<::c10d::Store>& store, std::chrono::milliseconds timeout)>;
// The MPI wing: a communicator over MPI_COMM_WORLD (the store is unused).
CommunicatorFactory mpi_communicator_factory();
// The UCX wing: create_ucx_communicator with `rank` of `size`, meeting on
// the group's c10d store (C10dStore). Each creation on one store takes the
// next generation of that store (a counter per rank in the store), so a
// job may create several worlds on one store, in the same order on every
// rank. `address` names the store in messages.
CommunicatorFactory ucx_communicator_factory(int rank, int size, std::string address);

// relaxcc's Store over a c10d Store: what the UCX wing's rendezvous reads
// and writes goes to torch's store (TCPStore, FileStore, PrefixStore...).
// A get or wait that runs past its timeout throws relaxcc's Timeout naming
// the keys and `address`; any failure of the c10d store throws
// CommunicationError with c10d's message. Waits poll check() (1 to 20 ms
// apart): c10d 1.13's waits cannot serve relaxcc's contract (see wait).
class C10dStore : public Store {
 public:
  C10dStore(c10::intrusive_ptr<::c10d::Store> store, std::string address);

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  using Store::get;
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::vector<uint8_t> compare_set(const std::string& key, const std::vector<uint8_t>& expected,
                                   const std::vector<uint8_t>& desired) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t num_keys() override;
  bool delete_key(const std::string& key) override;
  std::string address() const override { return address_; }

 private:
  c10::intrusive_ptr<::c10d::Store> store_;
  std::string address_;
};

// A c10d Work over a relaxcc Work: `finish` (copies results out, may be
// empty) runs in relaxcc's completion callback once the operation
// succeeded, before the future completes with `outputs`.
class RelaxccWork : public ::c10d::Work {
 public:
  RelaxccWork(int rank, ::c10d::OpType type, const WorkPtr& op, std::vector<at::Tensor> outputs,
              std::function<void()> finish, std::chrono::milliseconds timeout);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  bool wait(std::chrono::milliseconds timeout) override;
  std::vector<at::Tensor> result() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  void synchronize() override {}
  // The relaxcc Work that completes after `finish` ran.
  const WorkPtr& relaxcc_work() const noexcept { return done_; }

 private:
  WorkPtr done_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::chrono::milliseconds timeout_;
};

class ProcessGroupRelaxcc : public BackendBase {
 public:
  // Collective over the group's members (c10d's creation callback: `rank`
  // of `size` in the group, its store and timeout). `parent`: the default
  // group when it is a relaxcc group (its world communicator is shared);
  // null for the default group itself, whose creation makes the world
  // communicator with `factory`. Throws InvalidArgument for a group whose
  // members the world communicator does not have, and the store's errors
  // (a member that does not arrive within the store's timeout).
  static c10::intrusive_ptr<ProcessGroupRelaxcc> create(
      const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
      std::chrono::milliseconds timeout, const c10::intrusive_ptr<ProcessGroupRelaxcc>& parent,
      const CommunicatorFactory& factory);

  const std::string getBackendName() const override { return "relaxcc"; }
  const CommunicatorPtr& communicator() const noexcept { return comm_; }
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  // The world ranks of this group's members, in group rank order.
  const std::vector<int>& members() const noexcept { return members_; }

  c10::intrusive_ptr<::c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                             const ::c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                             const ::c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const ::c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                          const ::c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                             std::vector<at::Tensor>& inputs,
                                             const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                   const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const ::c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                           std::vector<std::vector<at::Tensor>>& inputs,
                                           const ::c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                                 std::vector<int64_t>& output_splits,
                                                 std::vector<int64_t>& input_splits,
                                                 const ::c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                            std::vector<at::Tensor>& inputs,
                                            const ::c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                        int tag) override;
  c10::intrusive_ptr<::c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                        int tag) override;
  // relaxcc receives from a named peer only: Unsupported.
  c10::intrusive_ptr<::c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                                 int tag) override;
  c10::intrusive_ptr<::c10d::Work> barrier(const ::c10d::BarrierOptions& opts) override;

  // What the groups of one default group share: its world communicator and,
  // per member list, how many groups with those members were made (the
  // relaxcc group key: members create their groups in the same order).
  struct Family {
    CommunicatorPtr world;
    std::map<std::vector<int>, uint64_t> groups_made;
  };
  // Use create().
  ProcessGroupRelaxcc(int rank, int size, std::shared_ptr<Family> family, CommunicatorPtr comm,
                      std::vector<int> members, std::chrono::milliseconds timeout);

  // The communicator that moves `t`'s memory: the group's for host tensors,
  // its NCCL communicator for CUDA tensors (created on first use).
  Communicator& on(const at::Tensor& t);

  // A c10d Work over `op` with this group's rank and timeout.
  c10::intrusive_ptr<RelaxccWork> wrap(::c10d::OpType type, const WorkPtr& op,
                                       std::vector<at::Tensor> outputs,
                                       std::function<void()> finish = {}) const;

 private:
  std::shared_ptr<Family> family_;
  CommunicatorPtr comm_;
  std::vector<int> members_;
  std::chrono::milliseconds timeout_;
  std::mutex device_mutex_;
  std::map<int, CommunicatorPtr> device_comms_;  // CUDA device index -> NCCL communicator
};

}  // namespace relaxcc::python

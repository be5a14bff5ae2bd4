#include "relaxcc/collective_setup.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <vector>

namespace relaxcc {

namespace {

// One rank's outcome as the allgather carries it: 0 passed, else the kind
// of its error, then the message.
constexpr size_t kRecord = 416;
constexpr size_t kMessage = kRecord - 8;
enum Kind : int64_t { kPassed = 0, kInvalidArgument = 1, kUnsupported = 2, kOther = 3 };

}  // namespace

void agree_on_checks(Communicator& comm, const std::string& what, const std::function<void()>& step,
                     std::chrono::milliseconds timeout,
                     std::initializer_list<Communicator*> also_poison,
                     std::chrono::milliseconds grace) {
  std::exception_ptr own;
  Kind kind = kPassed;
  std::string message, reason;
  bool mismatch = false;  // raised by the ranks together: nothing to poison
  try {
    step();
  } catch (const PeerMismatch& e) {
    own = std::current_exception();
    kind = kOther;
    message = e.message();
    mismatch = true;
  } catch (const InvalidArgument& e) {
    own = std::current_exception();
    kind = kInvalidArgument;
    message = e.message();
    reason = e.what();
  } catch (const Unsupported& e) {
    own = std::current_exception();
    kind = kUnsupported;
    message = e.message();
    reason = e.what();
  } catch (const Error& e) {
    own = std::current_exception();
    kind = kOther;
    message = e.message();
    reason = e.what();
  } catch (const std::exception& e) {
    own = std::current_exception();
    kind = kOther;
    message = reason = e.what();
  }
  const int n = comm.size();
  auto mine = std::make_shared<std::array<char, kRecord>>();
  mine->fill('\0');
  const int64_t k = kind;
  std::memcpy(mine->data(), &k, sizeof k);
  std::memcpy(mine->data() + 8, message.data(), std::min<size_t>(message.size(), 400));
  auto all = std::make_shared<std::vector<char>>(kRecord * static_cast<size_t>(n));
  AllgatherOptions o;
  o.label = what + ": agreement on every rank's outcome";
  if (own) {
    // The others may wait in a collective of the step that this rank never
    // joined: past the grace, they learn the error from a poisoning.
    bool agreed = true;
    try {
      agreed = comm.allgather(TensorView(mine->data(), static_cast<int64_t>(kRecord), DType::u8,
                                         Device::host(), mine),
                              TensorView(all->data(), static_cast<int64_t>(all->size()), DType::u8,
                                         Device::host(), all),
                              ExecContext::host(), o)
                   ->wait_for(grace);
    } catch (const std::exception&) {
      agreed = false;  // a poisoned communicator: poisoning is a no-op there
    }
    if (!agreed && !mismatch) {
      comm.poison(reason);
      for (Communicator* c : also_poison)
        if (c != nullptr) c->poison(reason);
    }
    std::rethrow_exception(own);
  }
  comm.allgather(
          TensorView(mine->data(), static_cast<int64_t>(kRecord), DType::u8, Device::host(), mine),
          TensorView(all->data(), static_cast<int64_t>(all->size()), DType::u8, Device::host(),
                     all),
          ExecContext::host(), o)
      ->wait(timeout);
  for (int r = 0; r < n; ++r) {
    const char* record = all->data() + kRecord * static_cast<size_t>(r);
    int64_t theirs = kPassed;
    std::memcpy(&theirs, record, sizeof theirs);
    if (theirs == kPassed) continue;
    const std::string text = detail::concat(
        what, ": rank ", r, " failed: ", std::string(record + 8, strnlen(record + 8, kMessage)));
    if (theirs == kInvalidArgument) RELAXCC_THROW(InvalidArgument, text);
    if (theirs == kUnsupported) RELAXCC_THROW(Unsupported, text);
    RELAXCC_THROW(PeerMismatch, text);
  }
}

}  // namespace relaxcc

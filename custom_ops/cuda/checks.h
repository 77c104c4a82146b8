// Where the input checks of the gpu target's kernels report (docs/custom_ops.md, "CUDA kernels"): each
// stream has a fault record in the backend's memory (cuda/bodies/faults.h) and, on the host, the message
// each check would give.
//
// By default an op reads the record back once its checks have run and fails there, as the CPU library
// does. A stream in deferred mode (sl_defer_checks; create_session's sessions on the CUDA provider)
// leaves the record on the device until Report: a run then copies back nothing but the sizes its
// outputs need, and its first fault is reported at its end with the same message, naming the op.
// Kernels after a fault still run (their bodies treat an index they would refuse as missing, so they
// never read outside their inputs); what they compute is never returned, because the run fails.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "common/status.h"
#include "cuda/bodies/faults.h"

namespace sparse_lower {
namespace kernels {

template <typename B>
void ClearRecordOn(typename B::Stream s, bodies::FaultRecord* record) {
  B::ForEach(s, 1, SL_LAMBDA(int64_t) { bodies::ClearRecord(record); });
}

template <typename B>
class Checks {
 public:
  // Throws the message of a failed check from its record.
  using Message = std::function<void(const bodies::FaultRecord&)>;

  // The checks of stream s (one per stream, for the life of the process: a stream's record is reused by
  // every op and run on it; a few dozen bytes each, never freed).
  static Checks& Of(typename B::Stream s) {
    static std::mutex mutex;
    static auto* all = new std::map<void*, std::unique_ptr<Checks>>();
    const std::lock_guard<std::mutex> lock(mutex);
    std::unique_ptr<Checks>& checks = (*all)[reinterpret_cast<void*>(s)];
    if (!checks) checks.reset(new Checks(s));
    return *checks;
  }

  void Defer(bool on) {
    const std::lock_guard<std::mutex> lock(mutex_);
    deferred_ = on;
  }
  bool Deferred() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return deferred_;
  }

  // The op whose checks follow, for a deferred report to name (empty: none named).
  void Within(std::string op) {
    const std::lock_guard<std::mutex> lock(mutex_);
    op_ = std::move(op);
  }

  // A new check, whose launches record under the id returned; `message` throws what it finds.
  int64_t Open(Message message) {
    const std::lock_guard<std::mutex> lock(mutex_);
    pending_[++last_] = {op_, std::move(message)};
    return last_;
  }

  bodies::FaultRecord* Record() { return record_.data(); }

  // After a check's launches: its verdict now, unless the stream defers it.
  void Settle(typename B::Stream s) {
    if (!Deferred()) Report(s);
  }

  // Reads the record (waiting for the stream): throws the message of the first failed check since the
  // last report, and clears it; forgets the checks either way.
  void Report(typename B::Stream s) {
    bodies::FaultRecord record{};
    B::ToHost(s, &record, record_.data(), sizeof record);
    std::pair<std::string, Message> failed;
    bool named = false;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (record.check != 0) failed = pending_.at(record.check);
      named = deferred_ && !failed.first.empty();  // reported after its op returned: say which op it was
      pending_.clear();
    }
    if (record.check == 0) return;
    ClearRecordOn<B>(s, record_.data());
    try {
      failed.second(record);
    } catch (const OpError& e) {
      if (!named) throw;
      Fail(failed.first, ": ", e.what());
    }
  }

 private:
  explicit Checks(typename B::Stream s) : record_(s, 1) { ClearRecordOn<B>(s, record_.data()); }

  typename B::template Buffer<bodies::FaultRecord> record_;
  std::mutex mutex_;
  bool deferred_ = false;
  std::string op_;
  int64_t last_ = 0;
  std::map<int64_t, std::pair<std::string, Message>> pending_;
};

}  // namespace kernels
}  // namespace sparse_lower

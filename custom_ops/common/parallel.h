// The one way kernels run in parallel: onnxruntime's intra-op thread pool, in thread-independent blocks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <limits>
#include <mutex>

#include "onnxruntime_cxx_api.h"

namespace sparse_lower {

// Items per block for a loop doing about `work` elementary operations per item: large enough that
// scheduling costs nothing, small enough to balance threads.
inline int64_t Grain(int64_t work) { return std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(work, 1)); }

// Runs body(block) for every block in [0, blocks). Callers fix the blocks from the problem size alone,
// never from the number of threads, and make each block write its own outputs: results are identical
// for any thread count. When blocks throw, the exception of the lowest block is rethrown after all have
// run, so the reported error does not depend on scheduling either.
template <typename F>
void ParallelBlocks(const Ort::KernelContext& ctx, int64_t blocks, F&& body) {
  if (blocks <= 0) return;
  if (blocks == 1) {
    body(int64_t{0});
    return;
  }
  struct Job {
    F& body;
    std::mutex mutex{};
    int64_t failed_block = std::numeric_limits<int64_t>::max();
    std::exception_ptr error{};
  } job{body};
  auto run = [](void* data, size_t index) {
    Job& job = *static_cast<Job*>(data);
    const auto block = static_cast<int64_t>(index);
    try {
      job.body(block);
    } catch (...) {
      std::lock_guard<std::mutex> lock(job.mutex);
      if (block < job.failed_block) {
        job.failed_block = block;
        job.error = std::current_exception();
      }
    }
  };
  ctx.ParallelFor(run, static_cast<size_t>(blocks), 0, &job);
  if (job.error) std::rethrow_exception(job.error);
}

// The number of blocks of `grain` items that cover n items.
inline int64_t BlockCount(int64_t n, int64_t grain) { return n <= 0 ? 0 : (n + grain - 1) / grain; }

// Runs body(begin, end) over [0, n) cut into blocks of `grain` items (see ParallelBlocks).
template <typename F>
void ParallelFor(const Ort::KernelContext& ctx, int64_t n, int64_t grain, F&& body) {
  ParallelBlocks(ctx, BlockCount(n, grain),
                 [&](int64_t block) { body(block * grain, std::min(n, (block + 1) * grain)); });
}

}  // namespace sparse_lower

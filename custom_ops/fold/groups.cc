#include "fold/groups.h"

#include <algorithm>
#include <utility>

#include "common/parallel.h"
#include "common/status.h"

namespace sparse_lower {
namespace {

void CheckEntry(int64_t p, int64_t target, int64_t targets) {
  if (target < -1 || target >= targets) {
    Fail("idx value ", target, " (entry ", p, ") is outside [0, ", targets, "), the rows or sites of Y; only -1 skips");
  }
}

// A counting sort: O(count + targets), for targets not much more numerous than the entries (mode rows).
Groups ByCounting(const int64_t* idx, int64_t count, int64_t targets) {
  std::vector<int64_t> next(static_cast<size_t>(targets) + 1, 0);
  for (int64_t p = 0; p < count; ++p) {
    CheckEntry(p, idx[p], targets);
    if (idx[p] >= 0) ++next[idx[p] + 1];
  }
  Groups groups;
  for (int64_t t = 0; t < targets; ++t) {
    if (next[t + 1] > 0) groups.target.push_back(t);
    next[t + 1] += next[t];
  }
  groups.entry.resize(static_cast<size_t>(next[targets]));
  for (const int64_t t : groups.target) groups.start.push_back(next[t]);
  groups.start.push_back(next[targets]);
  for (int64_t p = 0; p < count; ++p) {
    if (idx[p] >= 0) groups.entry[next[idx[p]]++] = p;
  }
  return groups;
}

// A comparison sort: O(count log count), for huge target ranges (mode dense, B·V sites).
Groups BySorting(const int64_t* idx, int64_t count, int64_t targets) {
  std::vector<std::pair<int64_t, int64_t>> pairs;  // (target, p)
  pairs.reserve(static_cast<size_t>(count));
  for (int64_t p = 0; p < count; ++p) {
    CheckEntry(p, idx[p], targets);
    if (idx[p] >= 0) pairs.emplace_back(idx[p], p);
  }
  std::sort(pairs.begin(), pairs.end());
  Groups groups;
  for (size_t i = 0; i < pairs.size(); ++i) {
    if (i == 0 || pairs[i].first != pairs[i - 1].first) {
      groups.target.push_back(pairs[i].first);
      groups.start.push_back(static_cast<int64_t>(i));
    }
    groups.entry.push_back(pairs[i].second);
  }
  groups.start.push_back(static_cast<int64_t>(pairs.size()));
  return groups;
}

}  // namespace

Groups GroupByTarget(const int64_t* idx, int64_t count, int64_t targets) {
  return targets <= 4 * count + 1024 ? ByCounting(idx, count, targets) : BySorting(idx, count, targets);
}

std::optional<std::vector<int64_t>> AscendingRows(const Ort::KernelContext& ctx, const int64_t* idx, int64_t rows,
                                                  int64_t width, int64_t targets) {
  std::vector<int64_t> lengths(static_cast<size_t>(rows));
  std::vector<char> ascending(static_cast<size_t>(rows));
  ParallelFor(ctx, rows, Grain(width), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t* row = idx + r * width;
      int64_t length = 0;
      bool ordered = true;
      for (int64_t i = 0; i < width; ++i) {
        CheckEntry(r * width + i, row[i], targets);
        if (row[i] < 0) continue;
        ordered = ordered && length == i && (i == 0 || row[i] > row[i - 1]);
        ++length;
      }
      lengths[r] = length;
      ascending[r] = ordered;
    }
  });
  if (std::find(ascending.begin(), ascending.end(), 0) != ascending.end()) return std::nullopt;
  return lengths;
}

}  // namespace sparse_lower

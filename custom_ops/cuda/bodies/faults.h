// The record of a failed input check, in the backend's memory (cuda/checks.h says how the host reads it).
//
// Checks run in stream order, one launch after another, and each has an id: a check records only while
// no earlier check of the stream has (so the record holds the first failure, the one the CPU library,
// failing in that op, would name), and its threads keep the least failing row or entry. Then the values
// its message quotes are copied into the record, because the inputs they come from may be reused by the
// time the host reads it.
#pragma once

#include <cstdint>
#include <cstring>

#include "cuda/bodies/sites.h"
#include "cuda/hd.h"

namespace sparse_lower {
namespace bodies {

constexpr int kFaultValues = 6;  // a coordinate's 1 + 3 values, and two more

struct FaultRecord {
  int64_t check;                 // the id of the first failing check, 0 while none has failed
  int64_t at;                    // its least failing row or entry (kNone until then)
  int64_t values[kFaultValues];  // what its message quotes
};

SL_HD inline void ClearRecord(FaultRecord* f) {
  f->check = 0;
  f->at = kNone;
  for (int64_t& v : f->values) v = 0;
}

// Whether check `id` may record: no earlier check has.
SL_HD inline bool Open(const FaultRecord* f, int64_t id) { return f->check == 0 || f->check == id; }

// Check `id` found `at` wrong (every writer writes the same id: no order needed).
SL_HD inline void Record(FaultRecord* f, int64_t id, int64_t at) {
  f->check = id;
  AtomicMin(&f->at, at);
}

// Whether the record holds check `id`'s failure (then its values are to be copied).
SL_HD inline bool Holds(const FaultRecord* f, int64_t id) { return f->check == id; }

// A float quoted in a message, kept as its bits.
SL_HD inline int64_t FloatBits(float v) {
  uint32_t bits = 0;
  memcpy(&bits, &v, sizeof bits);
  return bits;
}

// A value as the record keeps it: integers as they are, floats as their bits.
SL_HD inline int64_t Quoted(int64_t v) { return v; }
SL_HD inline int64_t Quoted(int8_t v) { return v; }
SL_HD inline int64_t Quoted(float v) { return FloatBits(v); }

inline float BitsFloat(int64_t bits) {
  const auto word = static_cast<uint32_t>(bits);
  float v = 0.0f;
  std::memcpy(&v, &word, sizeof v);
  return v;
}

}  // namespace bodies
}  // namespace sparse_lower

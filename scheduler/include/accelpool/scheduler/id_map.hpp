// IdMap: a hash map from 64-bit ids to 32-bit values, for the scheduler's request table (request id ->
// index of its entry).
//
// Open addressing with linear probing in one flat array whose size is a power of two, kept at most half
// full, so a lookup touches one or two adjacent slots: one cache miss where a node-based map takes two or
// three. Keys are spread by Fibonacci hashing, so dense or strided ids do not cluster. Erase shifts later
// members of the probe run back instead of leaving tombstones.
//
// Invariant: every key sits in its home slot or after it, with no empty slot between home and key.
// find, insert and erase are O(1) expected; insert may rehash (O(n), amortized O(1)). Memory: 16 bytes per
// slot, 2 to 4 slots per key at the largest size the map has had (it never shrinks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

namespace accelpool::scheduler {

class IdMap {
 public:
  static constexpr std::uint32_t npos = std::numeric_limits<std::uint32_t>::max();

  // The value stored for `key`, or npos if absent.
  std::uint32_t find(std::uint64_t key) const {
    if (size_ == 0) return npos;
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.value == npos) return npos;
      if (s.key == key) return s.value;
    }
  }

  // Stores `value` (which must not be npos) for `key`. Returns false, changing nothing, if `key` is present.
  bool insert(std::uint64_t key, std::uint32_t value) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.value == npos) {
        s = {key, value};
        ++size_;
        return true;
      }
      if (s.key == key) return false;
    }
  }

  // Removes `key`. Returns false if it was absent.
  bool erase(std::uint64_t key) {
    if (size_ == 0) return false;
    std::size_t hole = home(key);
    while (true) {
      if (slots_[hole].value == npos) return false;
      if (slots_[hole].key == key) break;
      hole = (hole + 1) & mask_;
    }
    // Close the hole: move back each later member of the run whose home does not lie in (hole, i].
    for (std::size_t i = (hole + 1) & mask_; slots_[i].value != npos; i = (i + 1) & mask_) {
      const std::size_t h = home(slots_[i].key);
      const bool home_after_hole = hole <= i ? (hole < h && h <= i) : (hole < h || h <= i);
      if (!home_after_hole) {
        slots_[hole] = slots_[i];
        hole = i;
      }
    }
    slots_[hole].value = npos;
    --size_;
    return true;
  }

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  struct Slot {
    std::uint64_t key = 0;
    std::uint32_t value = npos;  // npos: empty
  };

  std::size_t home(std::uint64_t key) const {
    return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ULL) >> shift_);
  }

  void grow() {
    std::vector<Slot> old = std::move(slots_);
    const std::size_t capacity = old.empty() ? 16 : 2 * old.size();
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
    shift_ = 64;
    for (std::size_t c = capacity; c > 1; c >>= 1) --shift_;
    size_ = 0;
    for (const Slot& s : old) {
      if (s.value != npos) insert(s.key, s.value);
    }
  }

  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  unsigned shift_ = 64;  // 64 - log2(slots_.size())
  std::size_t size_ = 0;
};

}  // namespace accelpool::scheduler

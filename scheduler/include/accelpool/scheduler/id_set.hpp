// IdSet: a set of small integer ids as a two-level bitmap, for the free-device index.
//
// insert, erase and contains are O(1); finding the next id at or after a given one is O(1) within a
// 4,096-id block plus a scan of one summary bit per 4,096 ids. Iteration is in ascending order. Memory is
// one bit per id up to the largest id inserted, plus 1/64 of that.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace accelpool::scheduler {

class IdSet {
 public:
  static constexpr std::uint32_t npos = std::numeric_limits<std::uint32_t>::max();

  // Returns false if `id` was already present.
  bool insert(std::uint32_t id) {
    const std::size_t w = id >> 6;
    if (w >= words_.size()) {
      words_.resize(w + 1, 0);
      summary_.resize((words_.size() + 63) >> 6, 0);
    }
    const std::uint64_t bit = std::uint64_t{1} << (id & 63);
    if (words_[w] & bit) return false;
    words_[w] |= bit;
    summary_[w >> 6] |= std::uint64_t{1} << (w & 63);
    ++size_;
    return true;
  }

  // Returns false if `id` was absent.
  bool erase(std::uint32_t id) {
    const std::size_t w = id >> 6;
    if (w >= words_.size()) return false;
    const std::uint64_t bit = std::uint64_t{1} << (id & 63);
    if (!(words_[w] & bit)) return false;
    words_[w] &= ~bit;
    if (words_[w] == 0) summary_[w >> 6] &= ~(std::uint64_t{1} << (w & 63));
    --size_;
    return true;
  }

  bool contains(std::uint32_t id) const {
    const std::size_t w = id >> 6;
    return w < words_.size() && (words_[w] >> (id & 63)) & 1;
  }

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // The smallest id >= from, or npos.
  std::uint32_t next(std::uint32_t from) const {
    std::size_t w = from >> 6;
    if (w >= words_.size()) return npos;
    const std::uint64_t here = words_[w] & (~std::uint64_t{0} << (from & 63));
    if (here) return static_cast<std::uint32_t>((w << 6) + std::countr_zero(here));
    // Find the next non-empty word through the summary.
    ++w;
    std::size_t s = w >> 6;
    if (s >= summary_.size()) return npos;
    std::uint64_t bits = (w & 63) ? summary_[s] & (~std::uint64_t{0} << (w & 63)) : summary_[s];
    while (!bits) {
      if (++s >= summary_.size()) return npos;
      bits = summary_[s];
    }
    const std::size_t word = (s << 6) + std::countr_zero(bits);
    return static_cast<std::uint32_t>((word << 6) + std::countr_zero(words_[word]));
  }

  std::uint32_t first() const { return next(0); }

  class iterator {
   public:
    using value_type = std::uint32_t;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    iterator(const IdSet* set, std::uint32_t id) : set_(set), id_(id) {}
    std::uint32_t operator*() const { return id_; }
    iterator& operator++() {
      id_ = id_ == npos - 1 ? npos : set_->next(id_ + 1);
      return *this;
    }
    iterator operator++(int) {
      iterator old = *this;
      ++*this;
      return old;
    }
    bool operator==(const iterator& o) const { return id_ == o.id_; }

   private:
    const IdSet* set_ = nullptr;
    std::uint32_t id_ = npos;
  };
  iterator begin() const { return {this, first()}; }
  iterator end() const { return {this, npos}; }

 private:
  std::vector<std::uint64_t> words_;
  std::vector<std::uint64_t> summary_;  // bit w set when words_[w] != 0
  std::size_t size_ = 0;
};

}  // namespace accelpool::scheduler

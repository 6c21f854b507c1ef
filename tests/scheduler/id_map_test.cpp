// IdMap, the scheduler's request table: checked against std::unordered_map under random inserts and erases.
#include <accelpool/scheduler/id_map.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <unordered_map>
#include <vector>

using accelpool::scheduler::IdMap;

TEST_CASE("IdMap stores, finds and erases ids", "[id_map]") {
  IdMap map;
  CHECK(map.empty());
  CHECK(map.find(7) == IdMap::npos);
  CHECK_FALSE(map.erase(7));
  CHECK(map.insert(7, 70));
  CHECK(map.insert(0, 1));
  CHECK(map.insert(~std::uint64_t{0}, 2));
  CHECK_FALSE(map.insert(7, 99));  // present: unchanged
  CHECK(map.size() == 3);
  CHECK(map.find(7) == 70);
  CHECK(map.find(0) == 1);
  CHECK(map.find(~std::uint64_t{0}) == 2);
  CHECK(map.find(8) == IdMap::npos);
  CHECK(map.erase(7));
  CHECK_FALSE(map.erase(7));
  CHECK(map.find(7) == IdMap::npos);
  CHECK(map.find(0) == 1);
  CHECK(map.size() == 2);
}

TEST_CASE("IdMap keeps every id reachable through growth and erases inside probe runs", "[id_map]") {
  // A small live set over a large id range keeps the table small and full of collisions and wrap-arounds;
  // dense and strided ids are the patterns callers produce.
  for (const std::uint64_t stride : {std::uint64_t{1}, std::uint64_t{16}, std::uint64_t{1} << 32}) {
    std::mt19937_64 rng(stride);
    IdMap map;
    std::unordered_map<std::uint64_t, std::uint32_t> reference;
    std::vector<std::uint64_t> live;
    for (std::uint32_t step = 0; step < 20000; ++step) {
      const bool add = live.size() < 8 || (live.size() < 600 && rng() % 3 != 0);
      if (add) {
        const std::uint64_t id = (rng() % 5000) * stride;
        const bool fresh = !reference.count(id);
        REQUIRE(map.insert(id, step) == fresh);
        if (fresh) {
          reference[id] = step;
          live.push_back(id);
        }
      } else {
        const std::size_t k = rng() % live.size();
        const std::uint64_t id = live[k];
        live[k] = live.back();
        live.pop_back();
        REQUIRE(map.erase(id));
        reference.erase(id);
      }
      REQUIRE(map.size() == reference.size());
      if (step % 97 == 0) {
        for (const auto& [id, value] : reference) REQUIRE(map.find(id) == value);
        for (int probe = 0; probe < 20; ++probe) {
          const std::uint64_t id = (rng() % 5000) * stride;
          REQUIRE((map.find(id) == IdMap::npos) == !reference.count(id));
        }
      }
    }
    for (const auto& [id, value] : reference) REQUIRE(map.find(id) == value);
  }
}

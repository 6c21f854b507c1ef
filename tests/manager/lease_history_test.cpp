// The memory window of ended leases (CoreOptions::history) is only a cache: leases that end long after newer
// ones, listings and lookups of old leases all hold whatever the window's size.
#include <set>

#include "test_support.hpp"

using namespace accelpool::manager;
using accelpool::Errc;
using namespace accelpool::manager::test;

namespace {

CoreOptions small_history(std::size_t n) {
  CoreOptions o;
  o.history = n;
  return o;
}

// Live leases and ended ones, optionally of one tenant or device, or in one state.
LeaseFilter with_ended() {
  LeaseFilter f;
  f.include_ended = true;
  return f;
}
LeaseFilter of_tenant(const std::string& t) {
  LeaseFilter f = with_ended();
  f.tenant = t;
  return f;
}
LeaseFilter on_device(const std::string& d) {
  LeaseFilter f = with_ended();
  f.device = d;
  return f;
}
LeaseFilter in_state(LeaseState s) {
  LeaseFilter f;
  f.state = s;
  return f;
}

// Acquires and releases one lease `n` times (each on the first free device).
std::vector<LeaseId> cycle(Pool& pool, int n, const std::string& tenant = "a") {
  std::vector<LeaseId> ids;
  for (int i = 0; i < n; ++i) {
    Lease l = pool.acquire(tenant, "vm-cycle");
    REQUIRE(l.state == LeaseState::granted);
    REQUIRE(pool.core->release(Caller::direct(tenant, "vm-cycle"), l.id).is_ok());
    ids.push_back(l.id);
  }
  return ids;
}

// Every page of a listing, checked for order and duplicates on the way.
std::vector<Lease> all_pages(PoolCore& core, const LeaseFilter& f, LeasePageSpec spec) {
  std::vector<Lease> out;
  std::set<LeaseId> seen;
  for (int pages = 0; pages < 1000; ++pages) {
    auto page = core.page(f, spec);
    REQUIRE(page.is_ok());
    CHECK(page->leases.size() <= spec.limit);
    for (const auto& l : page->leases) {
      CHECK(seen.insert(l.id).second);
      if (!out.empty()) CHECK((spec.newest_first ? l.id < out.back().id : l.id > out.back().id));
      out.push_back(l);
    }
    if (!page->next) return out;
    CHECK(*page->next == page->leases.back().id);
    spec.after = page->next;
  }
  FAIL("a listing that never ends");
  return out;
}

}  // namespace

TEST_CASE("a lease that ends after more than `history` newer leases ended is released, durably", "[core][history]") {
  Pool pool(make_devices("fpga", 2), small_history(3));
  Lease holder = pool.acquire("a", "vm-holder");
  cycle(pool, 10);
  pool.clock.advance(1);
  auto rel = pool.core->release(Caller::direct("a", "vm-holder"), holder.id);
  REQUIRE(rel.is_ok());
  CHECK(rel->state == LeaseState::released);
  CHECK(pool.log.count(holder.id, LeaseEvent::ended) == 1);
  CHECK(pool.core->device("local/fpga0")->state == "free");
  // A crash and restart: the release was committed, nothing ends it again or brings it back.
  pool.restart(make_devices("fpga", 2));
  CHECK(pool.get(holder.id).state == LeaseState::released);
  CHECK(pool.core->list(LeaseFilter{}).empty());
  pool.clock.advance(60);
  pool.core->tick();
  CHECK(pool.get(holder.id).state == LeaseState::released);
}

TEST_CASE("leases that end in one group commit all reach the store, whatever the window", "[core][history]") {
  Pool pool(make_devices("fpga", 5), small_history(2));
  std::vector<LeaseId> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(pool.acquire("a", "vm" + std::to_string(i)).id);
  pool.core->set_group_commit(true);
  for (LeaseId id : ids) REQUIRE(pool.core->release(Caller::admin(), id).is_ok());
  pool.core->commit();
  pool.restart(make_devices("fpga", 5));
  for (LeaseId id : ids) {
    INFO("lease " << id);
    CHECK(pool.get(id).state == LeaseState::released);
  }
  CHECK(pool.core->leases_by_state()["granted"] == 0);
}

TEST_CASE("listing and lookup read ended leases from the store, page by page", "[core][history]") {
  Pool pool(make_devices("fpga", 3), small_history(2));
  Lease live_a = pool.acquire("a", "vm-live");
  auto ended_a = cycle(pool, 7, "a");
  auto ended_b = cycle(pool, 4, "b");
  Lease live_b = pool.acquire("b", "vm-live");
  Lease queued = pool.acquire("a", "vm-wait", 3);
  REQUIRE(queued.state == LeaseState::queued);

  SECTION("a lease long gone from memory is found by id, and only by its tenant or the admin") {
    CHECK(pool.core->list(with_ended()).size() == 3 + 2);  // the window: 3 live, 2 ended
    auto old = pool.core->get(Caller::admin(), ended_a.front());
    REQUIRE(old.is_ok());
    CHECK(old->state == LeaseState::released);
    CHECK(old->guest == "vm-cycle");
    CHECK(pool.core->get(Caller::direct("a", "vm-cycle"), ended_a.front()).is_ok());
    // Another guest of the same tenant does not own it, from the store either.
    CHECK(pool.core->get(Caller::direct("a", "vm-other"), ended_a.front()).error().code == Errc::not_found);
    auto other = pool.core->get(Caller::direct("b", "vm-cycle"), ended_a.front());
    REQUIRE_FALSE(other.is_ok());
    CHECK(other.error().code == Errc::not_found);
    auto none = pool.core->get(Caller::admin(), 999999);
    REQUIRE_FALSE(none.is_ok());
    CHECK(none.error().code == Errc::not_found);
  }

  SECTION("every lease, live and ended, once, in id order, in pages of any size, both ways") {
    std::set<LeaseId> expected{live_a.id, live_b.id, queued.id};
    expected.insert(ended_a.begin(), ended_a.end());
    expected.insert(ended_b.begin(), ended_b.end());
    for (std::size_t limit : {1u, 2u, 3u, 5u, 16u, 100u}) {
      for (bool newest_first : {false, true}) {
        INFO("limit " << limit << (newest_first ? " newest first" : " oldest first"));
        LeasePageSpec spec;
        spec.limit = limit;
        spec.newest_first = newest_first;
        auto all = all_pages(*pool.core, with_ended(), spec);
        std::set<LeaseId> got;
        for (const auto& l : all) got.insert(l.id);
        CHECK(got == expected);
      }
    }
  }

  SECTION("filters apply to the stored leases too") {
    LeasePageSpec spec;
    spec.limit = 3;
    auto b_all = all_pages(*pool.core, of_tenant("b"), spec);
    CHECK(b_all.size() == ended_b.size() + 1);
    for (const auto& l : b_all) CHECK(l.tenant == "b");
    LeaseFilter mine = with_ended();
    mine.owner = Caller::direct("a", "vm-cycle");
    auto owned = all_pages(*pool.core, mine, spec);
    CHECK(owned.size() == ended_a.size());
    for (const auto& l : owned) CHECK((l.tenant == "a" && l.guest == "vm-cycle"));
    auto released = all_pages(*pool.core, in_state(LeaseState::released), spec);
    CHECK(released.size() == ended_a.size() + ended_b.size());
    auto live_only = all_pages(*pool.core, LeaseFilter{}, spec);
    CHECK(live_only.size() == 3);
    auto on_fpga0 = all_pages(*pool.core, on_device("local/fpga0"), spec);
    REQUIRE_FALSE(on_fpga0.empty());
    for (const auto& l : on_fpga0) {
      CHECK(std::find(l.devices.begin(), l.devices.end(), "local/fpga0") != l.devices.end());
    }
    // A device name is matched whole, not as a prefix of another.
    CHECK(all_pages(*pool.core, on_device("local/fpga"), spec).empty());
  }

  SECTION("a listing keeps serving while leases end between its pages") {
    LeasePageSpec spec;
    spec.limit = 4;
    auto first = pool.core->page(with_ended(), spec);
    REQUIRE(first.is_ok());
    REQUIRE(first->next);
    REQUIRE(pool.core->release(Caller::direct("a", "vm-live"), live_a.id).is_ok());
    spec.after = first->next;
    auto rest = all_pages(*pool.core, with_ended(), spec);
    bool seen_live_a = false;
    for (const auto& l : first->leases) seen_live_a = seen_live_a || l.id == live_a.id;
    for (const auto& l : rest) {
      if (l.id == live_a.id) {
        seen_live_a = true;
        CHECK(l.state == LeaseState::released);
      }
    }
    CHECK(seen_live_a);
  }
}

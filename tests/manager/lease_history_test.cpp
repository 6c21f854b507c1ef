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

TEST_CASE("a commit in flight: leases that end while it is written stay until their own commit is durable",
          "[core][history][pipeline]") {
  Pool pool(make_devices("fpga", 5), small_history(2));
  std::vector<LeaseId> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(pool.acquire("a", "vm" + std::to_string(i)).id);
  pool.core->set_group_commit(true);
  REQUIRE(pool.core->release(Caller::admin(), ids[0]).is_ok());
  PoolCore::Commit first = pool.core->take_commit();
  REQUIRE(first.batch.leases.size() == 1);
  REQUIRE(first.events.size() == 1);
  CHECK_FALSE(pool.core->has_uncommitted());
  // While the first commit is written, three more leases end: the window of 2 overflows.
  for (int i = 1; i < 4; ++i) REQUIRE(pool.core->release(Caller::admin(), ids[i]).is_ok());
  CHECK(pool.log.count(ids[0], LeaseEvent::ended) == 0);  // nobody hears of it before it is durable
  REQUIRE(pool.store->apply(first.batch).is_ok());
  pool.core->finish_commit(std::move(first));
  CHECK(pool.log.count(ids[0], LeaseEvent::ended) == 1);
  CHECK(pool.log.count(ids[1], LeaseEvent::ended) == 0);
  // Memory forgot the lease now in the store, not those only the next commit writes.
  for (int i = 0; i < 4; ++i) {
    INFO("lease " << ids[i]);
    CHECK(pool.get(ids[i]).state == LeaseState::released);
  }
  PoolCore::Commit second = pool.core->take_commit();
  CHECK(second.batch.leases.size() == 3);
  REQUIRE(pool.store->apply(second.batch).is_ok());
  pool.core->finish_commit(std::move(second));
  pool.restart(make_devices("fpga", 5));
  for (int i = 0; i < 4; ++i) {
    INFO("lease " << ids[i]);
    CHECK(pool.get(ids[i]).state == LeaseState::released);
  }
  CHECK(pool.get(ids[4]).state == LeaseState::granted);
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

TEST_CASE("a guest's heartbeat, listing and limits cover its own live leases, through the index of leases by guest",
          "[core][owner]") {
  CoreOptions o;
  o.max_live_per_guest = 4;
  Pool pool(make_devices("fpga", 2), o);
  REQUIRE(pool.core->update_tenant("a", std::nullopt, 5).is_ok());  // tenant a: 5 devices held or wanted
  const Caller vm1 = Caller::direct("a", "vm1");
  const Caller relayed_vm1{"a", "vm1", "local", true};  // the same guest id, through the host's relay: not vm1
  std::vector<LeaseId> mine;
  for (int i = 0; i < 3; ++i) mine.push_back(pool.acquire("a", "vm1").id);  // 2 granted, 1 queued
  AcquireParams relay = acquire_params("a", "vm1", "fpga", 1);
  relay.relayed = true;
  relay.guest_host = "local";
  auto theirs = pool.core->acquire(relay);
  REQUIRE(theirs.is_ok());
  const LeaseId other_tenant = pool.acquire("b", "vm1").id;
  const LeaseId other_guest = pool.acquire("a", "vm2").id;

  auto ids = [](const std::vector<Lease>& ls) {
    std::vector<LeaseId> out;
    for (const auto& l : ls) out.push_back(l.id);
    return out;
  };
  // Each caller's view, against a filter over every live lease.
  auto check_views = [&] {
    const auto every = pool.core->list(LeaseFilter{});
    for (const Caller& c : {vm1, relayed_vm1, Caller::direct("a", "vm2"), Caller::direct("b", "vm1")}) {
      std::vector<LeaseId> expected;
      for (const auto& l : every) {
        if (c.owns(l)) expected.push_back(l.id);
      }
      LeaseFilter f;
      f.owner = c;
      CHECK(ids(pool.core->list(f)) == expected);
      for (bool newest_first : {false, true}) {
        auto paged =
            ids(all_pages(*pool.core, f, LeasePageSpec{.after = {}, .limit = 1, .newest_first = newest_first}));
        if (newest_first) std::reverse(paged.begin(), paged.end());
        CHECK(paged == expected);
      }
      auto beat = pool.core->heartbeat(c, std::nullopt);
      REQUIRE(beat.is_ok());
      CHECK(ids(*beat) == expected);
    }
  };
  check_views();

  // The tenant's quota counts live leases only: 5 devices are held or wanted by tenant a's 5 leases.
  auto over = pool.core->acquire(acquire_params("a", "vm3", "fpga", 1));
  REQUIRE_FALSE(over.is_ok());
  CHECK(over.error().code == Errc::quota_exceeded);
  // vm1's leases leave the index as they end: released, cancelled while queued, expired.
  REQUIRE(pool.core->cancel(vm1, mine[2]).is_ok());
  REQUIRE(pool.core->release(vm1, mine[0]).is_ok());
  check_views();
  CHECK(pool.core->acquire(acquire_params("a", "vm3", "fpga", 1)).is_ok());  // room again in the quota
  // The per-guest limit counts the live leases of guest id vm1 (direct or relayed): 2 left, so 2 more fit and a
  // fifth does not.
  REQUIRE(pool.core->update_tenant("a", std::nullopt, 100).is_ok());
  for (int i = 0; i < 2; ++i) pool.acquire("a", "vm1");
  auto fifth = pool.core->acquire(acquire_params("a", "vm1", "fpga", 1));
  REQUIRE_FALSE(fifth.is_ok());
  CHECK(fifth.error().code == Errc::quota_exceeded);
  check_views();
  // Every other lease keeps heartbeating, vm1's last granted one does not: it expires and leaves vm1's view.
  for (int i = 0; i < 3; ++i) {
    pool.clock.advance(pool.options.lease_ttl_s / 2 + 1);
    for (const Caller& c :
         {relayed_vm1, Caller::direct("a", "vm2"), Caller::direct("a", "vm3"), Caller::direct("b", "vm1")}) {
      REQUIRE(pool.core->heartbeat(c, std::nullopt).is_ok());
    }
    pool.core->tick();
  }
  CHECK(pool.get(mine[1]).state == LeaseState::expired);
  CHECK(pool.get(theirs->id).state != LeaseState::expired);
  CHECK(pool.get(other_tenant).state != LeaseState::expired);
  CHECK(pool.get(other_guest).state != LeaseState::expired);
  check_views();
}

TEST_CASE("a heartbeat renews expiries in memory and writes nothing, and a restart gives every live lease a fresh TTL",
          "[core][owner]") {
  Pool pool(make_devices("fpga", 1));
  Lease held = pool.acquire("a", "vm1");
  Lease waiting = pool.acquire("a", "vm1");
  pool.posts.drain();
  const Caller vm1 = Caller::direct("a", "vm1");
  const auto rows = pool.store->lease_rows;
  pool.clock.advance(20);
  auto beat = pool.core->heartbeat(vm1, std::nullopt);
  REQUIRE(beat.is_ok());
  REQUIRE(beat->size() == 2);
  CHECK(pool.store->lease_rows == rows);  // 100,000 waiting requests would otherwise be written every heartbeat
  CHECK(pool.get(held.id).expires_at == Approx(pool.clock.now() + pool.options.lease_ttl_s));
  pool.clock.advance(pool.options.lease_ttl_s - 1);
  pool.core->tick();
  CHECK(pool.get(held.id).state == LeaseState::granted);  // renewed: alive past the first expiry
  CHECK(pool.get(waiting.id).state == LeaseState::queued);

  pool.restart(make_devices("fpga", 1));
  CHECK(pool.get(held.id).state == LeaseState::granted);
  CHECK(pool.get(held.id).expires_at == Approx(pool.clock.now() + pool.options.lease_ttl_s));
  CHECK(pool.get(waiting.id).state == LeaseState::queued);
}

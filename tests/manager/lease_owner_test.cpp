// Who owns a lease (Caller::owns), and what a grant does to a lease's TTL. The core over a real SQLite file and
// a manual clock.
#include "test_support.hpp"

using namespace accelpool::manager;
using accelpool::Errc;
using namespace accelpool::manager::test;

namespace {

Lease acquire_relayed(Pool& pool, const std::string& vm, const std::string& host) {
  AcquireParams p = acquire_params("a", vm);
  p.guest_host = host;
  p.relayed = true;
  auto r = pool.core->acquire(p);
  REQUIRE(r.is_ok());
  return *r;
}

}  // namespace

TEST_CASE("only the guest that acquired a lease may touch it, and an admin may touch every lease", "[core][owner]") {
  Pool pool(make_devices("fpga", 1));
  Lease a = pool.acquire("a", "vm1");
  Lease q = pool.acquire("a", "vm1");
  const Caller other = Caller::direct("a", "vm2");
  CHECK(pool.core->get(other, a.id).error().code == Errc::not_found);
  CHECK(pool.core->heartbeat(other, a.id).error().code == Errc::not_found);
  CHECK(pool.core->release(other, a.id).error().code == Errc::not_found);
  CHECK(pool.core->cancel(other, q.id).error().code == Errc::not_found);
  CHECK(pool.core->heartbeat(other, std::nullopt)->empty());
  LeaseFilter f;
  f.owner = other;
  CHECK(pool.core->list(f).empty());
  CHECK(pool.get(a.id).state == LeaseState::granted);
  CHECK(pool.get(q.id).state == LeaseState::queued);
  // An ended lease of another guest is not found either (not "already ended").
  REQUIRE(pool.core->release(pool.owner(a), a.id).is_ok());
  CHECK(pool.core->release(other, a.id).error().code == Errc::not_found);
  CHECK(pool.core->release(pool.owner(a), a.id).error().code == Errc::invalid_state);
  CHECK(pool.core->get(Caller::admin(), a.id).is_ok());
  CHECK(pool.core->revoke(q.id, "").is_ok());
}

TEST_CASE("a relayed VM's lease belongs to that VM on that host, through restarts", "[core][owner]") {
  Pool pool(make_devices("fpga", 2));
  Lease l = acquire_relayed(pool, "web-1", "local");
  CHECK(l.relayed);
  const Caller port{"a", "web-1", "local", true};
  for (int round = 0; round < 2; ++round) {
    INFO("round " << round);
    CHECK(pool.core->get(Caller::direct("a", "web-1"), l.id).error().code == Errc::not_found);  // direct, same name
    CHECK(pool.core->get(Caller{"a", "web-1", "hv-02", true}, l.id).error().code == Errc::not_found);  // other host
    CHECK(pool.core->get(Caller{"a", "web-2", "local", true}, l.id).error().code == Errc::not_found);  // other VM
    CHECK(pool.core->get(port, l.id).is_ok());
    pool.restart(make_devices("fpga", 2));  // the voucher is stored with the lease
  }
  CHECK(pool.core->release(port, l.id).is_ok());
}

TEST_CASE("a grant keeps the expiry of the guest's last heartbeat, and an expired request is not granted",
          "[core][ttl]") {
  CoreOptions opts;
  opts.lease_ttl_s = 10;
  Pool pool(make_devices("fpga", 1), opts);
  const double t0 = pool.clock.now();
  Lease holder = pool.acquire("a", "vm1");
  Lease alive = pool.acquire("a", "vm2");
  pool.clock.advance(6);
  REQUIRE(pool.core->heartbeat(pool.owner(holder), std::nullopt).is_ok());
  REQUIRE(pool.core->heartbeat(pool.owner(alive), std::nullopt).is_ok());  // expires at 16
  Lease dead = pool.acquire("b", "vm3");                                   // expires at 16 too, never renewed
  pool.clock.advance(2);
  REQUIRE(pool.core->release(pool.owner(holder), holder.id).is_ok());
  Lease granted = pool.get(alive.id);
  REQUIRE(granted.state == LeaseState::granted);
  CHECK(granted.expires_at == Approx(t0 + 16));  // before: t0 + 8 + 10, a fresh TTL at the grant
  pool.posts.drain();

  // vm2 keeps heartbeating; vm3's guest is gone. Its request is due when vm2 releases after its expiry, before
  // any tick: it must not get the device.
  pool.clock.advance(7);  // 15
  REQUIRE(pool.core->heartbeat(pool.owner(alive), std::nullopt).is_ok());
  pool.clock.advance(2);  // 17: vm3's TTL ran out at 16
  REQUIRE(pool.core->release(pool.owner(alive), alive.id).is_ok());
  Lease after = pool.get(dead.id);
  CHECK(after.state == LeaseState::expired);
  CHECK(after.end_reason == "no heartbeat for the lease TTL");
  CHECK(pool.log.count(dead.id, LeaseEvent::granted) == 0);
  pool.posts.drain();
  CHECK(pool.core->device("local/fpga0")->state == "free");
  CHECK(pool.core->device("local/fpga0")->lease == std::nullopt);
}

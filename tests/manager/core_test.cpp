#include <accelpool/manager/auth.hpp>
#include <algorithm>
#include <set>
#include "test_support.hpp"

using namespace accelpool::manager;
using accelpool::Errc;
using namespace accelpool::manager::test;

TEST_CASE("a lease goes queued -> granted -> released and the next request is served", "[core]") {
  Pool pool(make_devices("fpga", 1));
  Lease a = pool.acquire("a", "vm1", 1, "vadd");
  CHECK(a.state == LeaseState::granted);
  CHECK(a.devices == std::vector<std::string>{"local/fpga0"});
  CHECK_FALSE(a.ready);
  CHECK(pool.log.count(a.id, LeaseEvent::granted) == 0);
  pool.posts.drain();  // the host finishes programming
  CHECK(pool.get(a.id).ready);
  CHECK(pool.log.count(a.id, LeaseEvent::granted) == 1);
  CHECK(pool.core->device("local/fpga0")->record.loaded == "vadd");

  Lease b = pool.acquire("a", "vm2");
  CHECK(b.state == LeaseState::queued);
  CHECK(pool.core->queue_length() == 1);

  pool.clock.advance(5);
  auto rel = pool.core->release(pool.owner(a), a.id);
  REQUIRE(rel.is_ok());
  CHECK(rel->state == LeaseState::released);
  CHECK(rel->ended_at - rel->created_at == Approx(5));
  CHECK(pool.get(b.id).state == LeaseState::granted);
  CHECK(pool.log.count(a.id, LeaseEvent::ended) == 1);

  auto again = pool.core->release(pool.owner(a), a.id);
  REQUIRE_FALSE(again.is_ok());
  CHECK(again.error().code == Errc::invalid_state);
  auto st = pool.core->stats(3600);
  CHECK(st.all.jct.count == 1);
  CHECK(st.all.jct.avg == Approx(5));
}

TEST_CASE("queued requests are served in FIFO order and cancel removes one", "[core]") {
  Pool pool(make_devices("fpga", 1));
  Lease a = pool.acquire("a", "vm1");
  pool.clock.advance(1);
  Lease b = pool.acquire("a", "vm2");
  pool.clock.advance(1);
  Lease c = pool.acquire("b", "vm3");
  pool.clock.advance(1);
  Lease d = pool.acquire("a", "vm4");
  auto q = pool.core->queue();
  REQUIRE(q.size() == 3);
  CHECK(q[0].id == b.id);
  CHECK(q[1].id == c.id);
  CHECK(q[2].id == d.id);

  auto cancelled = pool.core->cancel(pool.owner(b), b.id);
  REQUIRE(cancelled.is_ok());
  CHECK(cancelled->state == LeaseState::cancelled);
  auto not_queued = pool.core->cancel(pool.owner(a), a.id);
  REQUIRE_FALSE(not_queued.is_ok());
  CHECK(not_queued.error().code == Errc::invalid_state);

  REQUIRE(pool.core->release(pool.owner(a), a.id).is_ok());
  CHECK(pool.get(c.id).state == LeaseState::granted);
  CHECK(pool.get(d.id).state == LeaseState::queued);
}

TEST_CASE("a gang request is granted all devices at once or waits", "[core]") {
  Pool pool(make_devices("fpga", 3));
  Lease one = pool.acquire("a", "vm1");
  Lease gang = pool.acquire("a", "vm2", 3);
  CHECK(gang.state == LeaseState::queued);
  CHECK(gang.devices.empty());
  REQUIRE(pool.core->release(pool.owner(one), one.id).is_ok());
  Lease g = pool.get(gang.id);
  CHECK(g.state == LeaseState::granted);
  CHECK(g.devices.size() == 3);
  pool.posts.drain();
  CHECK(pool.get(gang.id).ready);
  auto too_big = [&] {
    AcquireParams p{"a", "vm3", "", "fpga", "", 4, std::nullopt};
    return pool.core->acquire(p);
  }();
  REQUIRE_FALSE(too_big.is_ok());
  CHECK(too_big.error().code == Errc::infeasible);
}

TEST_CASE("a lease whose guest stops heartbeating expires and its device serves the next", "[core]") {
  CoreOptions opts;
  opts.lease_ttl_s = 10;
  Pool pool(make_devices("fpga", 1), opts);
  Lease a = pool.acquire("a", "vm1");
  Lease b = pool.acquire("b", "vm2");
  pool.clock.advance(8);
  REQUIRE(pool.core->heartbeat(Caller::direct("a", "vm1"), std::nullopt).is_ok());
  REQUIRE(pool.core->heartbeat(pool.owner(b), b.id).is_ok());
  REQUIRE(pool.core->next_wakeup().has_value());
  CHECK(*pool.core->next_wakeup() == Approx(pool.clock.now() + 10));
  pool.elapse(9);
  CHECK(pool.get(a.id).state == LeaseState::granted);
  REQUIRE(pool.core->heartbeat(Caller::direct("b", "vm2"), std::nullopt).is_ok());
  pool.elapse(2);  // a's last heartbeat was 11 s ago
  CHECK(pool.get(a.id).state == LeaseState::expired);
  CHECK(pool.get(b.id).state == LeaseState::granted);
  CHECK(pool.core->counters().expirations == 1);
}

TEST_CASE("an admin revocation gives the guest its grace period", "[core]") {
  CoreOptions opts;
  opts.revoke_grace_s = 5;
  Pool pool(make_devices("fpga", 1), opts);
  Lease a = pool.acquire("a", "vm1");
  Lease b = pool.acquire("a", "vm2");
  auto r = pool.core->revoke(a.id, "maintenance");
  REQUIRE(r.is_ok());
  CHECK(r->state == LeaseState::revoking);
  CHECK(r->revoke_deadline == Approx(pool.clock.now() + 5));
  CHECK(pool.log.count(a.id, LeaseEvent::revoking) == 1);
  pool.elapse(4);
  CHECK(pool.get(a.id).state == LeaseState::revoking);
  pool.elapse(2);
  CHECK(pool.get(a.id).state == LeaseState::revoked);
  CHECK(pool.get(a.id).end_reason == "maintenance");
  CHECK(pool.get(b.id).state == LeaseState::granted);

  // Released inside the grace period: a normal release.
  auto r2 = pool.core->revoke(b.id, "");
  REQUIRE(r2.is_ok());
  auto rel = pool.core->release(pool.owner(b), b.id);
  REQUIRE(rel.is_ok());
  CHECK(rel->state == LeaseState::released);
}

TEST_CASE("a tenant sees and releases only its own leases", "[core]") {
  Pool pool(make_devices("fpga", 1));
  Lease a = pool.acquire("a", "vm1");
  auto peek = pool.core->get(Caller::direct("b", "vm1"), a.id);
  REQUIRE_FALSE(peek.is_ok());
  CHECK(peek.error().code == Errc::not_found);
  auto steal = pool.core->release(Caller::direct("b", "vm1"), a.id);
  REQUIRE_FALSE(steal.is_ok());
  CHECK(steal.error().code == Errc::not_found);
  CHECK(pool.get(a.id).state == LeaseState::granted);
  CHECK(pool.core->authenticate(pool.token).value() == "a");
  CHECK(pool.core->authenticate(pool.token_b).value() == "b");
  CHECK_FALSE(pool.core->authenticate("apt_wrong").is_ok());
  auto rotated = pool.core->rotate_tenant_token("a");
  REQUIRE(rotated.is_ok());
  CHECK_FALSE(pool.core->authenticate(pool.token).is_ok());
  CHECK(pool.core->authenticate(*rotated).value() == "a");
}

TEST_CASE("quotas and bad input are refused without changing anything", "[core]") {
  Pool pool(make_devices("fpga", 4));
  REQUIRE(pool.core->update_tenant("a", 2.0, 2u).is_ok());
  pool.acquire("a", "vm1", 2);
  AcquireParams p{"a", "vm1", "", "fpga", "", 1, std::nullopt};
  auto over = pool.core->acquire(p);
  REQUIRE_FALSE(over.is_ok());
  CHECK(over.error().code == Errc::quota_exceeded);

  auto before = pool.core->list({}).size();
  std::vector<AcquireParams> bad = {
      {"b", "vm", "", "fpga", "", 0, std::nullopt},          // count 0
      {"b", "", "", "fpga", "", 1, std::nullopt},            // no guest
      {"b", "vm", "", "gpu", "", 1, std::nullopt},           // no such kind
      {"b", "vm", "", "fpga", "bad name", 1, std::nullopt},  // bitstream charset
      {"b", "vm", "", "fpga", "", 1, -1.0},                  // negative estimate
      {"b", "vm", "", "fpga", "", 1, std::nullopt, "a b"},   // label charset
      {"nobody", "vm", "", "fpga", "", 1, std::nullopt},     // unknown tenant
  };
  for (const auto& b : bad) {
    auto r = pool.core->acquire(b);
    CHECK_FALSE(r.is_ok());
  }
  CHECK(pool.core->list({}).size() == before);
  CHECK_FALSE(pool.core->create_tenant("a", 1, 0).is_ok());
  CHECK_FALSE(pool.core->create_tenant("x", 0, 0).is_ok());
  CHECK_FALSE(pool.core->set_policy("nonsense+first-fit").is_ok());
  CHECK(pool.core->policy() == "fifo+first-fit");
}

TEST_CASE("the policy switches at runtime and survives a restart", "[core]") {
  Pool pool(make_devices("fpga", 1));
  REQUIRE(pool.core->set_policy("sjf+affinity").is_ok());
  CHECK(pool.core->policy().rfind("sjf+affinity", 0) == 0);
  pool.restart(make_devices("fpga", 1));
  CHECK(pool.core->policy().rfind("sjf+affinity", 0) == 0);
}

TEST_CASE("draining a device keeps it from new grants", "[core]") {
  Pool pool(make_devices("fpga", 2));
  REQUIRE(pool.core->set_draining("local/fpga0", true).is_ok());
  Lease a = pool.acquire("a", "vm1");
  CHECK(a.devices == std::vector<std::string>{"local/fpga1"});
  Lease b = pool.acquire("a", "vm2");
  CHECK(b.state == LeaseState::queued);
  CHECK(pool.core->device("local/fpga0")->state == "draining");
  REQUIRE(pool.core->set_draining("local/fpga0", false).is_ok());
  CHECK(pool.get(b.id).state == LeaseState::granted);
  CHECK_FALSE(pool.core->set_draining("local/nope", true).is_ok());
}

TEST_CASE("a drained host grants nothing new and revokes what still runs at its deadline, across restarts",
          "[core][drain]") {
  CoreOptions opts;
  opts.revoke_grace_s = 2;
  opts.lease_ttl_s = 1000;
  Pool pool(make_devices("fpga", 2), opts);
  Lease a = pool.acquire("a", "vm1");
  pool.posts.drain();

  // Bad input changes nothing.
  CHECK(pool.core->set_host_draining("nowhere", true).error().code == Errc::not_found);
  CHECK(pool.core->set_host_draining("local", true, -1.0).error().code == Errc::invalid_argument);
  CHECK(pool.core->set_host_draining("local", false, 5.0).error().code == Errc::invalid_argument);
  CHECK(pool.core->set_draining("local/fpga0", true, std::nan("")).error().code == Errc::invalid_argument);
  CHECK_FALSE(pool.core->host_draining("local"));
  CHECK_FALSE(pool.core->device("local/fpga1")->record.draining);

  REQUIRE(pool.core->set_host_draining("local", true, 10.0).is_ok());
  CHECK(pool.core->host_draining("local"));
  CHECK(pool.core->device("local/fpga1")->state == "draining");
  CHECK(pool.core->device(a.devices[0])->drain_deadline == Approx(pool.clock.now() + 10));
  Lease b = pool.acquire("a", "vm2");
  CHECK(b.state == LeaseState::queued);  // the free device is drained too
  REQUIRE(pool.core->next_wakeup());
  CHECK(*pool.core->next_wakeup() <= pool.clock.now() + 10);

  // A crash keeps the drain and its deadline.
  pool.clock.advance(4);
  pool.restart(make_devices("fpga", 2));
  CHECK(pool.core->host_draining("local"));
  CHECK(pool.get(b.id).state == LeaseState::queued);
  CHECK(pool.core->device(a.devices[0])->drain_deadline == Approx(pool.clock.now() + 6));

  // Before the deadline the lease runs on; at the deadline it gets its grace period, then ends revoked.
  pool.elapse(5);
  CHECK(pool.get(a.id).state == LeaseState::granted);
  pool.elapse(1);
  CHECK(pool.get(a.id).state == LeaseState::revoking);
  CHECK(pool.get(a.id).end_reason == "device " + a.devices[0] + " was drained");
  CHECK_FALSE(pool.core->device(a.devices[0])->drain_deadline);
  pool.elapse(2);
  CHECK(pool.get(a.id).state == LeaseState::revoked);
  CHECK(pool.get(b.id).state == LeaseState::queued);  // the freed device stays drained

  // Undrain: the waiting lease is served.
  REQUIRE(pool.core->set_host_draining("local", false).is_ok());
  CHECK_FALSE(pool.core->host_draining("local"));
  CHECK(pool.get(b.id).state == LeaseState::granted);
}

TEST_CASE("after a crash, leases, queue order, devices and bitstreams come back", "[core][restart]") {
  CoreOptions opts;
  opts.lease_ttl_s = 10;
  Pool pool(make_devices("fpga", 2), opts);
  Lease a = pool.acquire("a", "vm1", 1, "vadd");
  Lease b = pool.acquire("b", "vm2", 1, "conv");
  pool.posts.drain();
  pool.clock.advance(1);
  Lease c = pool.acquire("a", "vm3");
  pool.clock.advance(1);
  Lease d = pool.acquire("b", "vm4", 2);
  pool.clock.advance(1);
  Lease e = pool.acquire("a", "vm5");
  REQUIRE(pool.core->release(pool.owner(b), b.id).is_ok());  // c takes b's device
  pool.posts.drain();
  Lease c_now = pool.get(c.id);
  REQUIRE(c_now.state == LeaseState::granted);

  pool.clock.advance(8);  // 8 s into a 10 s TTL: a restart must give a full TTL again
  pool.restart(make_devices("fpga", 2));
  CHECK(pool.get(a.id).state == LeaseState::granted);
  CHECK(pool.get(a.id).devices == a.devices);
  CHECK(pool.get(a.id).expires_at == Approx(pool.clock.now() + 10));
  CHECK(pool.get(c.id).devices == c_now.devices);
  CHECK(pool.get(b.id).state == LeaseState::released);
  auto q = pool.core->queue();
  REQUIRE(q.size() == 2);
  CHECK(q[0].id == d.id);
  CHECK(q[1].id == e.id);
  CHECK(pool.core->device(a.devices[0])->record.loaded == "vadd");
  CHECK(pool.core->device(a.devices[0])->lease == a.id);

  // New ids never reuse old ones; the restored grants are real: releasing serves the queue.
  Lease f = pool.acquire("a", "vm6");
  CHECK(f.id > e.id);
  REQUIRE(pool.core->release(pool.owner(a), a.id).is_ok());
  REQUIRE(pool.core->release(pool.owner(c), c.id).is_ok());
  // Both devices serve the restored queue (which ones is the policy's choice); none is held twice.
  std::set<std::string> held;
  std::size_t granted_devices = 0;
  for (const auto& l : pool.core->list({})) {
    if (l.state != LeaseState::granted) continue;
    granted_devices += l.devices.size();
    held.insert(l.devices.begin(), l.devices.end());
  }
  CHECK(granted_devices == 2);
  CHECK(held.size() == 2);
}

TEST_CASE("tokens are stored hashed", "[core][store]") {
  Pool pool;
  REQUIRE(pool.core->set_admin_token("admin-token-0123456789").is_ok());
  CHECK(pool.core->check_admin("admin-token-0123456789"));
  CHECK_FALSE(pool.core->check_admin("admin-token-012345678"));
  auto snap = pool.store->load(10);
  REQUIRE(snap.is_ok());
  for (const auto& t : snap->tenants) {
    CHECK(t.token_hash.size() == 64);
    CHECK(t.token_hash != pool.token);
  }
  CHECK(snap->meta.at("admin_token:admin") != "admin-token-0123456789");
  CHECK(snap->meta.at("admin_token:admin").size() == 64);
}

TEST_CASE("an acquire no host can ever serve names the guest's host, not a number", "[core][acquire]") {
  Pool pool(make_devices("fpga", 2, /*passthrough=*/true));
  AcquireParams p = acquire_params("a", "vm-9", "fpga", 3);
  p.guest_host = "local";
  auto r = pool.core->acquire(p);
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.error().code == Errc::infeasible);
  CHECK(r.error().message.find("only 2 of its kind are reachable") != std::string::npos);
  CHECK(r.error().message.find("(guest vm-9 on host local)") != std::string::npos);
  CHECK(r.error().message.find("host 0") == std::string::npos);
}

TEST_CASE("named admin tokens: issued, rotated and revoked, across a restart", "[core][store][tokens]") {
  Pool pool;
  auto first = pool.core->issue_admin_token("ops-1");
  REQUIRE(first.is_ok());
  CHECK(first->rfind("apa_", 0) == 0);
  CHECK(pool.core->issue_admin_token("ops-1").error().code == Errc::conflict);
  CHECK(pool.core->issue_admin_token("bad name").error().code == Errc::invalid_argument);
  CHECK(pool.core->issue_admin_token("nobody", true).error().code == Errc::not_found);
  auto second = pool.core->issue_admin_token("ops-2");
  REQUIRE(second.is_ok());
  auto rotated = pool.core->issue_admin_token("ops-1", true);
  REQUIRE(rotated.is_ok());
  CHECK_FALSE(pool.core->check_admin(*first));
  CHECK(pool.core->check_admin(*rotated));
  REQUIRE(pool.core->revoke_admin_token("ops-2").is_ok());
  CHECK_FALSE(pool.core->check_admin(*second));
  CHECK(pool.core->revoke_admin_token("ops-2").error().code == Errc::not_found);

  pool.restart(make_devices("fpga", 2));
  CHECK(pool.core->admin_token_names() == std::vector<std::string>{"ops-1"});
  CHECK(pool.core->check_admin(*rotated));
  CHECK_FALSE(pool.core->check_admin(*second));
}

TEST_CASE("the admin token of a store from before named tokens reads as the token named admin",
          "[core][store][tokens]") {
  Pool pool;
  const std::string token = "legacy-admin-token-0123456789";
  Batch legacy;
  legacy.meta.emplace_back("admin_token_hash", sha256_hex(token));
  REQUIRE(pool.store->apply(legacy).is_ok());
  pool.restart(make_devices("fpga", 2));
  CHECK(pool.core->admin_token_names() == std::vector<std::string>{"admin"});
  CHECK(pool.core->check_admin(token));
  REQUIRE(pool.core->revoke_admin_token("admin").is_ok());
  pool.restart(make_devices("fpga", 2));
  CHECK_FALSE(pool.core->has_admin_token());
  CHECK_FALSE(pool.core->check_admin(token));
}

TEST_CASE("a tenant is deleted only without live leases, and its token with it", "[core][store][tokens]") {
  Pool pool;
  auto l = pool.acquire("a", "vm1");
  auto refused = pool.core->delete_tenant("a");
  REQUIRE_FALSE(refused.is_ok());
  CHECK(refused.error().code == Errc::conflict);
  CHECK(refused.error().message.find("live leases " + std::to_string(l.id)) != std::string::npos);
  REQUIRE(pool.core->release(Pool::owner(l), l.id).is_ok());
  REQUIRE(pool.core->delete_tenant("a").is_ok());
  CHECK(pool.core->delete_tenant("a").error().code == Errc::not_found);
  CHECK_FALSE(pool.core->authenticate(pool.token).is_ok());
  // Created again in the same group commit as its deletion: the creation wins.
  pool.core->set_group_commit(true);
  REQUIRE(pool.core->delete_tenant("b").is_ok());
  REQUIRE(pool.core->create_tenant("b", 3, 0).is_ok());
  pool.core->commit();
  pool.restart(make_devices("fpga", 2));
  auto tenants = pool.core->tenants();
  REQUIRE(tenants.size() == 1);
  CHECK(tenants.front().name == "b");
  CHECK(tenants.front().weight == 3);
}

TEST_CASE("a preemption becomes a revocation with grace, then the lease waits again", "[core][preemption]") {
  CoreOptions opts;
  opts.policy = "srpt+first-fit";
  opts.revoke_grace_s = 5;
  Pool pool(make_devices("fpga", 1), opts);
  AcquireParams long_job{"a", "vm1", "", "fpga", "", 1, 1000.0};
  auto a = pool.core->acquire(long_job);
  REQUIRE(a.is_ok());
  REQUIRE(a->state == LeaseState::granted);
  pool.clock.advance(1);
  AcquireParams short_job{"b", "vm2", "", "fpga", "", 1, 1.0};
  auto b = pool.core->acquire(short_job);
  REQUIRE(b.is_ok());
  CHECK(b->state == LeaseState::queued);
  Lease victim = pool.get(a->id);
  REQUIRE(victim.state == LeaseState::revoking);
  CHECK(victim.revoke_deadline == Approx(pool.clock.now() + 5));
  CHECK(pool.log.count(a->id, LeaseEvent::revoking) == 1);
  pool.elapse(6);
  CHECK(pool.get(a->id).state == LeaseState::queued);
  CHECK(pool.log.count(a->id, LeaseEvent::requeued) == 1);
  CHECK(pool.get(b->id).state == LeaseState::granted);
  CHECK(pool.core->counters().preemptions == 1);
  REQUIRE(pool.core->release(pool.owner(*b), b->id).is_ok());
  CHECK(pool.get(a->id).state == LeaseState::granted);
  CHECK(pool.get(a->id).preemptions == 1);
}

namespace {
// A host that records what the core asks of it and completes through the poster. A prepare answers that the
// device was hot-plugged into the VM at a guest PCI address of its own, with the device's kind and model.
struct RecordingHost : HostDriver {
  std::string name_;
  std::vector<HostDevice> devices_;
  Poster post_;
  std::vector<std::string>* calls_;
  std::vector<accelpool::host::PrepareRequest> requests;
  RecordingHost(std::string n, std::vector<HostDevice> d, Poster p, std::vector<std::string>* calls)
      : name_(std::move(n)), devices_(std::move(d)), post_(std::move(p)), calls_(calls) {}
  const std::string& name() const override { return name_; }
  accelpool::Result<std::vector<HostDevice>> devices() override { return devices_; }
  void prepare(const accelpool::host::PrepareRequest& request, PrepareDone done) override {
    calls_->push_back(name_ + " prepare " + request.device + " " + request.vm);
    requests.push_back(request);
    accelpool::host::PrepareResult result;
    result.loaded = request.bitstream;
    result.attach = accelpool::host::AttachMode::pci_hostdev;
    result.guest_pci = guest_pci_of(request.device);
    for (const auto& d : devices_) {
      if (d.local_id == request.device) result.details = {d.kind, d.model, "test vendor", 0x10ee, 0x5005, 4096, ""};
    }
    post_([done, result] { done(accelpool::Status::ok(), result); });
  }
  // The address at which the guest sees `local` ("0000:00:1f.<n>" for the n-th device).
  std::string guest_pci_of(const std::string& local) const {
    for (std::size_t i = 0; i < devices_.size(); ++i)
      if (devices_[i].local_id == local) return "0000:00:1f." + std::to_string(i);
    return "";
  }
  void release(const std::string& local, Done done) override {
    calls_->push_back(name_ + " release " + local);
    post_([done] { done(accelpool::Status::ok(), ""); });
  }
  void reset(const std::string& local, Done done) override {
    calls_->push_back(name_ + " reset " + local);
    post_([done] { done(accelpool::Status::ok(), ""); });
  }
};
}  // namespace

TEST_CASE("a lost host's devices become unavailable, its leases wait again, and it comes back", "[core][hosts]") {
  Pool pool(make_devices("gpu", 1));
  std::vector<std::string> calls;
  REQUIRE(
      pool.core
          ->attach_host(std::make_unique<RecordingHost>("remote", make_devices("fpga", 2), pool.posts.poster(), &calls))
          .is_ok());
  Lease a = pool.acquire("a", "vm1", 2);
  REQUIRE(a.state == LeaseState::granted);
  pool.posts.drain();
  AcquireParams gp = acquire_params("b", "vm-g", "gpu");
  auto g1 = pool.core->acquire(gp);
  gp.guest = "vm-h";
  auto g2 = pool.core->acquire(gp);
  REQUIRE((g1 && g2));
  CHECK(g2->state == LeaseState::queued);

  // A second live host under the same name is refused.
  auto dup = pool.core->attach_host(
      std::make_unique<RecordingHost>("remote", make_devices("fpga", 2), pool.posts.poster(), &calls));
  REQUIRE_FALSE(dup.is_ok());
  CHECK(dup.error().code == Errc::conflict);
  CHECK(pool.core->host_lost("nowhere").error().code == Errc::not_found);

  calls.clear();
  REQUIRE(pool.core->host_lost("remote").is_ok());
  CHECK_FALSE(pool.core->host_live("remote"));
  CHECK(pool.core->device("remote/fpga0")->state == "unavailable");
  CHECK(pool.core->device("remote/fpga1")->state == "unavailable");
  CHECK(pool.get(a.id).state == LeaseState::queued);
  CHECK(pool.log.count(a.id, LeaseEvent::requeued) == 1);
  CHECK(calls.empty());                                  // nothing is sent to a lost host
  CHECK(pool.get(g1->id).state == LeaseState::granted);  // other hosts and the queue are untouched
  CHECK(pool.get(g2->id).state == LeaseState::queued);
  // Health reports for a lost host's device do not make it available.
  REQUIRE(pool.core->set_device_usable("remote/fpga0", true).is_ok());
  CHECK(pool.core->device("remote/fpga0")->state == "unavailable");

  // It returns: fpga1 is reported unusable, fpga0 serves a VM with no lease there (released by reconciliation).
  PoolCore::HostReport report;
  report.unusable.insert("fpga1");
  report.serving["fpga0"] = "vm-stale";
  REQUIRE(
      pool.core
          ->attach_host(std::make_unique<RecordingHost>("remote", make_devices("fpga", 2), pool.posts.poster(), &calls),
                        report)
          .is_ok());
  CHECK(pool.core->host_live("remote"));
  CHECK(pool.core->device("remote/fpga1")->state == "unavailable");
  CHECK(std::find(calls.begin(), calls.end(), "remote release fpga0") != calls.end());
  CHECK(pool.get(a.id).state == LeaseState::queued);  // needs two devices, one is unusable
  pool.posts.drain();
  REQUIRE(pool.core->set_device_usable("remote/fpga1", true).is_ok());
  CHECK(pool.get(a.id).state == LeaseState::granted);
  pool.posts.drain();
  CHECK(pool.get(a.id).ready);
  CHECK(pool.core->set_device_usable("remote/nope", true).error().code == Errc::not_found);

  // A failed device preempts its lease; a stopped VM ends its guest's leases.
  REQUIRE(pool.core->set_device_usable("remote/fpga1", false).is_ok());
  CHECK(pool.get(a.id).state == LeaseState::queued);
  CHECK(pool.core->end_guest_leases("remote", "vm-g", "x").empty());  // vm-g runs on another host
  auto ended = pool.core->end_guest_leases("local", "vm-g", "VM vm-g on host local shutdown");
  REQUIRE(ended.size() == 1);
  CHECK(ended[0].state == LeaseState::revoked);
  CHECK(ended[0].end_reason == "VM vm-g on host local shutdown");
  CHECK(pool.get(g2->id).state == LeaseState::granted);  // the waiting guest gets the GPU
  CHECK(pool.core->end_guest_leases("local", "vm-none", "x").empty());
}

TEST_CASE("a stopped VM ends only the leases of that VM on its host, not a same-named guest elsewhere",
          "[core][hosts]") {
  Pool pool(make_devices("gpu", 1));
  std::vector<std::string> calls;
  REQUIRE(
      pool.core
          ->attach_host(std::make_unique<RecordingHost>("remote", make_devices("gpu", 1), pool.posts.poster(), &calls))
          .is_ok());
  AcquireParams p = acquire_params("a", "web-1", "gpu");
  p.guest_host = "local";
  auto on_local = pool.core->acquire(p);
  p.tenant = "b";
  p.guest_host = "remote";
  auto on_remote = pool.core->acquire(p);
  REQUIRE((on_local && on_remote));
  pool.posts.drain();

  auto ended = pool.core->end_guest_leases("remote", "web-1", "VM web-1 on host remote destroyed");
  REQUIRE(ended.size() == 1);
  CHECK(ended[0].id == on_remote->id);
  CHECK(pool.get(on_local->id).state == LeaseState::granted);  // tenant a's web-1 runs on another host
}

TEST_CASE("one guest holds at most max_live_per_guest live leases, so hello and list stay bounded", "[core][quota]") {
  CoreOptions o;
  o.max_live_per_guest = 2;
  Pool pool(make_devices("fpga", 1), o);
  AcquireParams p = acquire_params("a", "vm1");
  auto first = pool.core->acquire(p);
  auto second = pool.core->acquire(p);  // queued behind the first
  REQUIRE((first && second));
  auto third = pool.core->acquire(p);
  REQUIRE_FALSE(third);
  CHECK(third.error().code == Errc::quota_exceeded);
  CHECK_THAT(third.error().message, Catch::Contains("max_per_guest"));
  CHECK(pool.core->list(LeaseFilter{}).size() == 2);  // the refusal changed nothing

  p.guest = "vm2";  // another guest of the tenant, and the same guest id in another tenant, are not limited by vm1
  CHECK(pool.core->acquire(p));
  p.tenant = "b";
  p.guest = "vm1";
  CHECK(pool.core->acquire(p));

  // An ended lease frees its place, and the count survives a restart.
  p.tenant = "a";
  REQUIRE(pool.core->cancel(Pool::owner(*second), second->id));
  CHECK(pool.core->acquire(p));
  pool.restart(make_devices("fpga", 1));
  CHECK(pool.core->acquire(p).error().code == Errc::quota_exceeded);
  REQUIRE(pool.core->release(Pool::owner(*first), first->id));
  CHECK(pool.core->acquire(p));
}

TEST_CASE("a grant keeps what each device's host did: a restart keeps it, a requeue forgets it", "[core][hosts]") {
  CoreOptions options;
  options.image_sha256 = [](const std::string& bitstream) { return "sha-of-" + bitstream; };
  Pool pool(make_devices("gpu", 1), options);
  std::vector<std::string> calls;
  auto remote = std::make_unique<RecordingHost>("remote", make_devices("fpga", 2), pool.posts.poster(), &calls);
  RecordingHost* host = remote.get();
  REQUIRE(pool.core->attach_host(std::move(remote)).is_ok());
  Lease a = pool.acquire("a", "vm1", 2, "vadd");
  REQUIRE(a.state == LeaseState::granted);
  REQUIRE(pool.get(a.id).grants.size() == 2);
  for (const auto& g : pool.get(a.id).grants) CHECK(g.details.kind.empty());  // nothing answered yet
  pool.posts.drain();

  // The core asked with the lease, the guest and the image's identity.
  REQUIRE(host->requests.size() == 2);
  for (const auto& r : host->requests) {
    CHECK(r.lease == std::to_string(a.id));
    CHECK(r.vm == "vm1");
    CHECK(r.bitstream == "vadd");
    CHECK(r.sha256 == "sha-of-vadd");
  }
  // Each device's answer sits beside it.
  auto check_grants = [&](const Lease& l) {
    REQUIRE(l.ready);
    REQUIRE(l.grants.size() == 2);
    for (std::size_t i = 0; i < 2; ++i) {
      INFO(l.devices[i]);
      CHECK(l.grants[i].guest_pci == host->guest_pci_of(l.devices[i].substr(l.devices[i].find('/') + 1)));
      CHECK(l.grants[i].attach == accelpool::host::AttachMode::pci_hostdev);
      CHECK(l.grants[i].loaded == "vadd");
      CHECK(l.grants[i].details.model == "test-fpga");
      CHECK(l.grants[i].details.vendor == "test vendor");
      CHECK(l.grants[i].details.memory_bytes == 4096);
    }
  };
  check_grants(pool.get(a.id));

  pool.restart(make_devices("gpu", 1));
  auto fresh = std::make_unique<RecordingHost>("remote", make_devices("fpga", 2), pool.posts.poster(), &calls);
  host = fresh.get();
  REQUIRE(pool.core->attach_host(std::move(fresh)).is_ok());
  check_grants(pool.get(a.id));
  CHECK(host->requests.empty());  // a ready lease is not prepared again

  REQUIRE(pool.core->host_lost("remote").is_ok());
  CHECK(pool.get(a.id).state == LeaseState::queued);
  CHECK(pool.get(a.id).grants.empty());
}

TEST_CASE("a gang of passthrough devices lands on the guest's own host, never split across hosts", "[core][hosts]") {
  Pool pool(make_devices("fpga", 4, /*passthrough=*/true));
  std::vector<std::string> calls;
  REQUIRE(pool.core
              ->attach_host(
                  std::make_unique<RecordingHost>("remote", make_devices("fpga", 4, true), pool.posts.poster(), &calls))
              .is_ok());
  auto on_host = [](const Lease& l, const std::string& host) {
    return std::all_of(l.devices.begin(), l.devices.end(),
                       [&](const std::string& d) { return d.rfind(host + "/", 0) == 0; });
  };
  AcquireParams p = acquire_params("a", "vm-remote", "fpga", 4);
  p.guest_host = "remote";
  auto remote = pool.core->acquire(p);
  REQUIRE(remote);
  CHECK(remote->state == LeaseState::granted);
  CHECK(on_host(*remote, "remote"));

  // Six devices for a guest on "local": the pool holds eight free-or-leased passthrough FPGAs, but only four on
  // the guest's host, so no grant may take devices of "remote".
  p.guest = "vm-local";
  p.guest_host = "local";
  p.count = 6;
  auto big = pool.core->acquire(p);
  if (big) {
    pool.posts.drain();
    CHECK(pool.get(big->id).state == LeaseState::queued);
    CHECK(pool.get(big->id).devices.empty());
  } else {
    CHECK(big.error().code == Errc::infeasible);
  }
  p.count = 4;
  auto local = pool.core->acquire(p);
  REQUIRE(local);
  CHECK(local->state == LeaseState::granted);
  CHECK(on_host(*local, "local"));
}

TEST_CASE("a lease goes only to devices of a model its bitstream fits, and waits for one", "[core][models]") {
  // Kind fpga has two models: fpga0 and fpga1 are u250 (first in line), fpga2 is u280.
  CoreOptions opts;
  opts.image_models = [](const std::string& bitstream) -> std::optional<std::vector<std::string>> {
    if (bitstream == "for-u280") return std::vector<std::string>{"u280", "u280-*"};
    if (bitstream == "for-u9") return std::vector<std::string>{"u9"};
    return std::nullopt;  // not in the registry: any model
  };
  Pool pool({{"fpga0", "fpga", "u250", false, ""},
             {"fpga1", "fpga", "u250", false, ""},
             {"fpga2", "fpga", "u280", false, ""}},
            opts);
  Lease first = pool.acquire("a", "vm1", 1, "for-u280");
  CHECK(first.state == LeaseState::granted);
  CHECK(first.devices == std::vector<std::string>{"local/fpga2"});
  // The only u280 is taken: the next one waits although both u250 are free.
  Lease second = pool.acquire("a", "vm2", 1, "for-u280");
  CHECK(second.state == LeaseState::queued);
  // A lease whose bitstream the registry does not hold takes any model, past the waiting one.
  Lease other = pool.acquire("a", "vm3", 1, "elsewhere");
  CHECK(other.state == LeaseState::granted);
  CHECK(other.devices == std::vector<std::string>{"local/fpga0"});
  pool.posts.drain();
  CHECK(pool.get(second.id).state == LeaseState::queued);
  REQUIRE(pool.core->release(Pool::owner(first), first.id).is_ok());
  pool.posts.drain();
  CHECK(pool.get(second.id).state == LeaseState::granted);
  CHECK(pool.get(second.id).devices == std::vector<std::string>{"local/fpga2"});

  // No model of the kind fits: refused up front, naming the models on both sides, and nothing queued.
  const auto queued_before = pool.core->queue_length();
  AcquireParams p = acquire_params("a", "vm4");
  p.bitstream = "for-u9";
  auto refused = pool.core->acquire(p);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == Errc::incompatible);
  CHECK(refused.error().message.find("fits device models u9") != std::string::npos);
  CHECK(refused.error().message.find("'u250', 'u280'") != std::string::npos);
  // More devices than the fitting models have: infeasible.
  p.bitstream = "for-u280";
  p.count = 2;
  refused = pool.core->acquire(p);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == Errc::infeasible);
  CHECK(pool.core->queue_length() == queued_before);

  // A lease waits for u280; a host joins whose device is of a new model the bitstream also fits: it goes there.
  Lease third = pool.acquire("a", "vm5", 1, "for-u280");
  CHECK(third.state == LeaseState::queued);
  REQUIRE(
      pool.core->attach_host(make_static_host("remote", {{"fpga0", "fpga", "u280-b", false, ""}}, pool.posts.poster()))
          .is_ok());
  pool.posts.drain();
  CHECK(pool.get(third.id).state == LeaseState::granted);
  CHECK(pool.get(third.id).devices == std::vector<std::string>{"remote/fpga0"});
  // u250 devices stayed out of every u280 lease: fpga1 was never granted.
  CHECK(pool.core->device("local/fpga1")->state == "free");
}

TEST_CASE("registering a bitstream again with another compatible list re-checks the leases that wait for it",
          "[core][models]") {
  // fpga0 is a u250, fpga1 a u280. The registry's list for "img" changes as the test registers new versions.
  auto compatible = std::make_shared<std::vector<std::string>>(std::vector<std::string>{"u280"});
  CoreOptions opts;
  opts.image_models = [compatible](const std::string& bitstream) -> std::optional<std::vector<std::string>> {
    if (bitstream == "img") return *compatible;
    return std::nullopt;
  };
  Pool pool({{"fpga0", "fpga", "u250", false, ""}, {"fpga1", "fpga", "u280", false, ""}}, opts);
  Lease holder = pool.acquire("a", "vm1", 1, "img");
  CHECK(holder.devices == std::vector<std::string>{"local/fpga1"});
  Lease waiting = pool.acquire("a", "vm2", 1, "img");
  CHECK(waiting.state == LeaseState::queued);  // the u250 is free, but "img" does not fit it

  // The image now fits the u250 too: the waiting lease is placed there at once.
  *compatible = {"u280", "u250"};
  pool.core->bitstream_changed("img");
  pool.posts.drain();
  CHECK(pool.get(waiting.id).state == LeaseState::granted);
  CHECK(pool.get(waiting.id).devices == std::vector<std::string>{"local/fpga0"});
  CHECK(pool.get(holder.id).state == LeaseState::granted);  // untouched

  // Back to u280 only: a new waiting lease waits for the u280, not for the u250 that comes free.
  *compatible = {"u280"};
  pool.core->bitstream_changed("img");
  Lease third = pool.acquire("a", "vm3", 1, "img");
  CHECK(third.state == LeaseState::queued);
  REQUIRE(pool.core->release(Pool::owner(pool.get(waiting.id)), waiting.id).is_ok());
  pool.posts.drain();
  CHECK(pool.get(third.id).state == LeaseState::queued);
  CHECK(pool.core->device("local/fpga0")->state == "free");

  // A list no device of the kind fits: the waiting lease ends, naming why; the granted one keeps its device.
  *compatible = {"u9"};
  pool.core->bitstream_changed("img");
  pool.posts.drain();
  const Lease ended = pool.get(third.id);
  CHECK(ended.state == LeaseState::revoked);
  CHECK_THAT(ended.end_reason, Catch::Contains("u9") && Catch::Contains("'fpga'"));
  CHECK(pool.get(holder.id).state == LeaseState::granted);
  CHECK(pool.core->queue_length() == 0);
}

TEST_CASE("a guest's job label groups what the pool learns, is checked, bounded per tenant, and kept", "[core]") {
  Pool pool(make_devices("fpga", 1));
  AcquireParams p = acquire_params("a", "vm1");
  p.label = "bad label";
  auto bad = pool.core->acquire(p);
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code == Errc::invalid_argument);
  CHECK_THAT(bad.error().message, Catch::Contains("label"));
  CHECK(pool.core->list(LeaseFilter{}).empty());  // the refusal changed nothing

  // Leases of one tenant, kind and gang size that differ only by label are learned apart.
  auto run = [&](const std::string& label, double seconds) {
    p.label = label;
    auto l = pool.core->acquire(p);
    REQUIRE(l);
    CHECK(l->label == label);
    pool.posts.drain();
    pool.clock.advance(seconds);
    REQUIRE(pool.core->release(Pool::owner(*l), l->id));
  };
  run("train.py", 100);
  run("train.py", 300);
  run("eval", 10);
  run("", 50);
  // observations and mean service of the group of tenant a, one device, the label (whole_kind groups excluded).
  auto group = [&](const std::string& label) -> std::pair<std::uint64_t, double> {
    for (const auto& g : pool.core->learned_estimates()) {
      if (!g.group.whole_kind && g.group.tenant == "a" && g.group.label == label) {
        return {g.group.observations, g.mean_device_s};
      }
    }
    return {0, 0};
  };
  auto train = group("train.py");
  CHECK(train.first == 2);
  CHECK(train.second == Approx(200.0).epsilon(0.2));
  CHECK(group("eval").first == 1);
  CHECK(group("").first == 1);

  // A queued lease keeps its label across a crash, and what it teaches after the restart lands in its group.
  p.label = "";
  auto holder = pool.core->acquire(p);
  REQUIRE(holder);
  p.label = "train.py";
  auto waiting = pool.core->acquire(p);
  REQUIRE(waiting);
  CHECK(waiting->state == LeaseState::queued);
  pool.restart(make_devices("fpga", 1));
  CHECK(pool.get(waiting->id).label == "train.py");
  REQUIRE(pool.core->release(Pool::owner(*holder), holder->id));
  pool.posts.drain();
  REQUIRE(pool.get(waiting->id).state == LeaseState::granted);
  pool.clock.advance(200);
  REQUIRE(pool.core->release(Pool::owner(*waiting), waiting->id));
  CHECK(group("train.py").first == 3);

  // A tenant may use kMaxLabelsPerTenant distinct labels; then a new one is refused, a known one is not, and
  // another tenant is not limited by it.
  for (std::size_t i = 0; i + 2 < kMaxLabelsPerTenant; ++i) {  // train.py and eval are two already
    p.label = "job-" + std::to_string(i);
    auto l = pool.core->acquire(p);
    REQUIRE(l);
    REQUIRE(pool.core->release(Pool::owner(*l), l->id));
  }
  p.label = "one-too-many";
  auto over = pool.core->acquire(p);
  REQUIRE_FALSE(over);
  CHECK(over.error().code == Errc::quota_exceeded);
  CHECK_THAT(over.error().message, Catch::Contains("1000 distinct labels"));
  p.label = "eval";
  CHECK(pool.core->acquire(p));
  p.tenant = "b";
  p.label = "one-too-many";
  CHECK(pool.core->acquire(p));
}

// The dashboard's live view (event_stream.cpp) kept from what each commit touched: a viewer that applies the
// deltas to its snapshot, as the page does, sees what a fresh read of the whole pool shows.
#include "event_stream.hpp"
#include "test_support.hpp"

#include <boost/json.hpp>

#include <map>

using namespace accelpool::manager;
using namespace accelpool::manager::test;
namespace json = boost::json;

namespace {

// The JSON of an SSE event "event: NAME\ndata: {...}\n\n", checking its name.
json::object event_data(const std::string& event, const std::string& name) {
  REQUIRE(event.starts_with("event: " + name + "\ndata: "));
  REQUIRE(event.ends_with("\n\n"));
  auto start = event.find("data: ") + 6;
  return json::parse(event.substr(start, event.size() - 2 - start)).as_object();
}

// What a page holds: devices and hosts by name, live leases by id, the queue shown.
struct Page {
  std::map<std::string, json::value> devices, hosts, leases;
  json::value queue;
  std::vector<json::value> ended;

  static std::string key(const json::value& item, const char* field) {
    const auto& v = item.as_object().at(field);
    return v.is_string() ? std::string(v.as_string()) : json::serialize(v);
  }
  static void fill(std::map<std::string, json::value>& into, const json::array& items, const char* field) {
    for (const auto& item : items) into[key(item, field)] = item;
  }
  explicit Page(const json::object& snapshot) {
    fill(devices, snapshot.at("devices").as_array(), "name");
    fill(hosts, snapshot.at("hosts").as_array(), "name");
    fill(leases, snapshot.at("leases").as_array(), "id");
    queue = snapshot.at("queue");
  }
  static void apply(std::map<std::string, json::value>& into, const json::object& change, const char* field) {
    fill(into, change.at("upsert").as_array(), field);
    for (const auto& gone : change.at("remove").as_array()) {
      into.erase(gone.is_string() ? std::string(gone.as_string()) : json::serialize(gone));
    }
  }
  void apply(const json::object& delta) {
    apply(devices, delta.at("devices").as_object(), "name");
    apply(hosts, delta.at("hosts").as_object(), "name");
    apply(leases, delta.at("leases").as_object(), "id");
    for (const auto& l : delta.at("leases").at("ended").as_array()) ended.push_back(l);
    if (auto* q = delta.if_contains("queue")) queue = *q;
  }
};

// Runs the stream's work to the end in slices of `budget`; returns how many calls it took.
int catch_up(EventStream& events, std::size_t budget) {
  int calls = 1;
  while (!events.work(budget)) ++calls;
  events.refresh();
  return calls;
}

// A stream that reads the whole pool now, as a new watcher's does.
std::string fresh_snapshot(Pool& pool, const Viewer& viewer) {
  EventStream fresh(*pool.core, pool.clock);
  fresh.start();
  catch_up(fresh, 1000);
  return *fresh.snapshot(viewer);
}

void check_same(const Page& page, const Page& fresh) {
  CHECK(page.devices == fresh.devices);
  CHECK(page.hosts == fresh.hosts);
  CHECK(page.leases == fresh.leases);
  CHECK(page.queue == fresh.queue);
}

}  // namespace

TEST_CASE("the core records what each commit touched only while asked to", "[core][events]") {
  Pool pool(make_devices("fpga", 2));
  pool.acquire("a", "vm0");
  CHECK(pool.core->take_touched().leases.empty());  // not tracking
  pool.core->track_touched(true);
  Lease a = pool.acquire("a", "vm1");
  auto touched = pool.core->take_touched();
  CHECK(touched.leases == std::set<LeaseId>{a.id});
  CHECK(pool.core->take_touched().leases.empty());  // taken: cleared
  REQUIRE(pool.core->set_draining(a.devices.at(0), true, std::nullopt).is_ok());
  CHECK(pool.core->take_touched().devices.count(a.devices.at(0)) == 1);
  REQUIRE(pool.core->set_host_draining("local", true, std::nullopt).is_ok());
  CHECK(pool.core->take_touched().hosts == std::set<std::string>{"local"});
  REQUIRE(pool.core->host_lost("local").is_ok());
  CHECK(pool.core->take_touched().hosts == std::set<std::string>{"local"});
  pool.core->track_touched(false);
  pool.acquire("b", "vm2");
  CHECK(pool.core->take_touched().leases.empty());
}

TEST_CASE("deltas from what commits touched keep a page equal to a fresh read of the pool", "[events]") {
  Pool pool(make_devices("fpga", 4));
  pool.core->track_touched(true);
  Lease before = pool.acquire("b", "vm0");  // live before anyone watches: found through its device
  pool.posts.drain();
  (void)pool.core->take_touched();  // what the daemon drops while nobody watches
  EventStream events(*pool.core, pool.clock);
  events.start();
  CHECK(catch_up(events, 1) > 4);  // one host page, then a device per slice
  const Viewer admin, tenant_a{"a"};
  Page page(event_data(*events.snapshot(admin), "snapshot"));
  Page page_a(event_data(*events.snapshot(tenant_a), "snapshot"));
  check_same(page, Page(event_data(fresh_snapshot(pool, admin), "snapshot")));
  CHECK(page.leases.size() == 1);
  CHECK(page_a.leases.empty());  // another tenant's lease
  CHECK(page_a.devices.at(before.devices.at(0)).at("lease").is_null());

  // Each step is committed (this core writes at once), handed over and published as the daemon does.
  auto step = [&] {
    events.note(pool.core->take_touched());
    catch_up(events, 2);
    page.apply(event_data(events.delta(admin), "delta"));
    page_a.apply(event_data(events.delta(tenant_a), "delta"));
    check_same(page, Page(event_data(fresh_snapshot(pool, admin), "snapshot")));
    check_same(page_a, Page(event_data(fresh_snapshot(pool, tenant_a), "snapshot")));
  };
  Lease gang = pool.acquire("a", "vm1", 3);
  step();
  CHECK(page.leases.size() == 2);
  CHECK(page_a.leases.size() == 1);
  CHECK(page_a.devices.at(gang.devices.at(0)).at("lease") == gang.id);
  Lease waiting = pool.acquire("a", "vm2");
  step();
  REQUIRE(page.queue.as_array().size() == 1);
  CHECK(page.queue.at(0).at("expected_start").is_null());  // fifo without a guard: no reservation, no estimate
  pool.clock.advance(2);
  REQUIRE(pool.core->release(pool.owner(gang), gang.id).is_ok());
  pool.posts.drain();
  step();
  CHECK(pool.get(waiting.id).state == LeaseState::granted);
  CHECK(page.queue.as_array().empty());
  REQUIRE(page_a.ended.size() == 1);
  CHECK(page_a.ended[0].at("id") == gang.id);
  REQUIRE(pool.core->set_draining(before.devices.at(0), true, std::nullopt).is_ok());
  step();
  CHECK(page.devices.at(before.devices.at(0)).at("draining") == true);
  REQUIRE(pool.core->host_lost("local").is_ok());  // every device shows unavailable; its leases are preempted
  pool.posts.drain();
  step();
  for (const auto& [name, d] : page.devices) CHECK(d.at("available") == false);
  CHECK(page.hosts.at("local").at("connected") == false);
}

TEST_CASE("a stream that nobody watches forgets the pool and ignores commits", "[events]") {
  Pool pool(make_devices("fpga", 2));
  pool.core->track_touched(true);
  EventStream events(*pool.core, pool.clock);
  events.note({{"local/fpga0"}, {}, {}});
  CHECK(events.work(10));  // stopped: nothing to read
  events.start();
  catch_up(events, 10);
  CHECK(Page(event_data(*events.snapshot({}), "snapshot")).devices.size() == 2);
  events.stop();
  CHECK_FALSE(events.active());
  events.note(pool.core->take_touched());
  CHECK(events.work(10));
}

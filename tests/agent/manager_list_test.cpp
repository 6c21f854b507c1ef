// Which manager the agent's connections (its link, each relayed guest port) try next (manager_list.hpp): the list
// in order, a leader a standby names at once, and never a tight loop between managers naming each other.
#include "manager_list.hpp"

#include <catch2/catch.hpp>

using accelpool::agent::ManagerList;
using accelpool::agent::standby_names_leader;

TEST_CASE("the managers are tried in turn, each after the backoff", "[agent][ha]") {
  ManagerList list({"a:1", "b:1", "c:1"});
  CHECK(list.current() == "a:1");
  CHECK_FALSE(list.advance(""));
  CHECK(list.current() == "b:1");
  CHECK_FALSE(list.advance(""));
  CHECK(list.current() == "c:1");
  CHECK_FALSE(list.advance(""));
  CHECK(list.current() == "a:1");

  ManagerList one({"only:1"});
  CHECK_FALSE(one.advance(""));
  CHECK(one.current() == "only:1");
}

TEST_CASE("a leader a standby names is tried at once, and when it fails the list goes on after the standby",
          "[agent][ha]") {
  ManagerList list({"a:1", "b:1", "c:1"});
  CHECK(list.advance("l:1"));  // a is a standby naming l
  CHECK(list.current() == "l:1");
  CHECK_FALSE(list.advance(""));  // l is gone
  CHECK(list.current() == "b:1");
  // A standby naming itself names no other manager: the list goes on.
  CHECK_FALSE(list.advance("b:1"));
  CHECK(list.current() == "c:1");
}

TEST_CASE("a named leader that names another is tried only after the backoff", "[agent][ha]") {
  ManagerList list({"a:1", "b:1"});
  CHECK(list.advance("x:1"));
  CHECK_FALSE(list.advance("y:1"));  // x names y: followed, not at once
  CHECK(list.current() == "y:1");
  CHECK_FALSE(list.advance("x:1"));  // y names x again: still not at once
  CHECK(list.current() == "x:1");
  CHECK_FALSE(list.advance(""));
  CHECK(list.current() == "b:1");
}

TEST_CASE("a standby's refusal names the leader, when it knows one", "[agent][ha]") {
  CHECK(standby_names_leader(R"({"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"standby",)"
                             R"("data":{"code":"not_leader","leader":"tcp://10.0.0.6:7070"}}})") ==
        "tcp://10.0.0.6:7070");
  CHECK(standby_names_leader(R"({"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"nobody leads",)"
                             R"("data":{"code":"not_leader"}}})") == "");
  CHECK(standby_names_leader(R"({"jsonrpc":"2.0","id":1,"result":{}})") == "");
  CHECK(standby_names_leader("not json") == "");
}

// device.prepare's params and result on the agent link: what one side writes, the other reads back whole, and a
// malformed message is an error naming the field.
#include <accelpool/agent/wire.hpp>

#include <catch2/catch.hpp>

using namespace accelpool;
namespace json = boost::json;

namespace {

host::PrepareResult full_result() {
  host::PrepareResult r;
  r.loaded = "vadd";
  r.attach = host::AttachMode::pci_hostdev;
  r.guest_pci = "0000:00:09.0";
  r.endpoint = "";
  r.details = {"fpga",        "xilinx_u250_gen3x16_xdma_4_1_202210_1", "Xilinx", 0x10ee, 0x5005, 68719476736ull,
               "0000:65:00.1"};
  return r;
}

// The error parse_prepare_result gives for the result text `text`.
std::string result_error(const std::string& text) {
  auto r = agent::parse_prepare_result(json::parse(text), "device.prepare result");
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::invalid_argument);
  return r.error().message;
}

}  // namespace

TEST_CASE("a prepare request and its result read back as they were written", "[agent][wire]") {
  host::PrepareRequest req{"sim:0", "42", "web-1", "vadd", std::string(64, 'a'), true};
  auto params = agent::prepare_request_json(req);
  auto back = agent::parse_prepare_request(json::parse(json::serialize(params)).as_object(), "device.prepare");
  REQUIRE(back);
  CHECK(back->device == "sim:0");
  CHECK(back->lease == "42");
  CHECK(back->vm == "web-1");
  CHECK(back->bitstream == "vadd");
  CHECK(back->sha256 == req.sha256);
  CHECK(back->reprogram);

  const auto sent = full_result();
  auto result = agent::parse_prepare_result(json::parse(json::serialize(agent::prepare_result_json(sent))), "r");
  REQUIRE(result);
  CHECK(result->loaded == "vadd");
  CHECK(result->attach == host::AttachMode::pci_hostdev);
  CHECK(result->guest_pci == "0000:00:09.0");
  CHECK(result->details.kind == "fpga");
  CHECK(result->details.model == sent.details.model);
  CHECK(result->details.vendor == "Xilinx");
  CHECK(result->details.pci_vendor_id == 0x10ee);
  CHECK(result->details.pci_device_id == 0x5005);
  CHECK(result->details.memory_bytes == 68719476736ull);
  CHECK(result->details.host_pci == "0000:65:00.1");

  // Absent fields are defaults: the smallest result an agent can send.
  auto small = agent::parse_prepare_result(json::parse(R"({"loaded":""})"), "r");
  REQUIRE(small);
  CHECK(small->attach == host::AttachMode::none);
  CHECK(small->details.memory_bytes == 0);
}

TEST_CASE("a malformed prepare result or request is an error naming the field", "[agent][wire]") {
  CHECK(result_error(R"("vadd")") == "device.prepare result: must be an object");
  CHECK(result_error(R"({"loaded":7})") == "device.prepare result: field 'loaded' must be a string");
  CHECK(result_error(R"({"attach":"usb"})") == "device.prepare result: field 'attach' has unknown mode 'usb'");
  CHECK(result_error(R"({"attached":true})") == "device.prepare result: unknown field 'attached'");
  CHECK(result_error(R"({"details":[]})") == "device.prepare result: field 'details': must be an object");
  CHECK(result_error(R"({"details":{"memory_bytes":-1}})") ==
        "device.prepare result: field 'details': field 'memory_bytes' must be a non-negative integer");
  CHECK(result_error(R"({"details":{"pci_vendor_id":4294967296}})") ==
        "device.prepare result: field 'details': field 'pci_vendor_id' is above 4294967295");
  CHECK(result_error(R"({"details":{"memory_bytes":1.5}})").find("'memory_bytes'") != std::string::npos);
  CHECK(result_error(R"({"details":{"serial":"x"}})") ==
        "device.prepare result: field 'details': unknown field 'serial'");

  auto missing = agent::parse_prepare_request(json::parse(R"({"bitstream":"vadd"})").as_object(), "device.prepare");
  REQUIRE_FALSE(missing);
  CHECK(missing.error().message == "device.prepare: field 'device' is required");
  auto wrong = agent::parse_prepare_request(json::parse(R"({"device":"d","reprogram":"yes"})").as_object(), "p");
  REQUIRE_FALSE(wrong);
  CHECK(wrong.error().message == "p: field 'reprogram' must be a boolean");
}

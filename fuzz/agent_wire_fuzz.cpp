// The agent protocol's wire layer (docs/agent-protocol.md): a byte stream split into lines with kMaxLine, each
// parsed as a JSON-RPC message; the strict field readers, the prepare codec and the reply builders run on what
// parses.
#include <accelpool/agent/wire.hpp>

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace accelpool;
  agent::LineBuffer lines(agent::kMaxLine);
  lines.append(std::string_view(reinterpret_cast<const char*>(data), size));
  while (auto line = lines.next_line()) {
    auto message = agent::parse_message(*line);
    if (!message) continue;
    const auto& params = message->params;
    (void)agent::get_string(params, "host", "register", true);
    (void)agent::get_string(params, "token", "register", false);
    (void)agent::get_bool(params, "passthrough", "register", false);
    (void)agent::only_fields(params, "protocol,token,host,devices", "register");
    if (auto request = agent::parse_prepare_request(params, "device.prepare"))
      (void)agent::parse_prepare_request(agent::prepare_request_json(*request), "device.prepare");
    if (message->result) {
      if (auto result = agent::parse_prepare_result(*message->result, "device.prepare result"))
        (void)agent::prepare_result_json(*result);
    }
    if (message->has_id) {
      (void)agent::result_line(message->id, message->result ? *message->result : boost::json::value(params));
      if (message->error) (void)agent::error_line(message->id, *message->error);
    } else if (!message->method.empty()) {
      (void)agent::notification_line(message->method, params);
    }
  }
  return 0;
}

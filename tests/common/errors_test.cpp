// The one table of error codes (common/include/accelpool/common/errors.hpp): names, HTTP statuses and JSON-RPC
// codes, checked against themselves and against the error tables of the protocol documents.
#include <accelpool/common/result.hpp>

#include <catch2/catch.hpp>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

using accelpool::Errc;

namespace {

std::string read_doc(const std::string& relative) {
  std::ifstream in(std::string(ACCELPOOL_SOURCE_DIR) + "/" + relative);
  REQUIRE(in);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Every `| -32xxx | word, word | ...` row of a Markdown error table: (JSON-RPC code, word) pairs.
std::vector<std::pair<int, std::string>> rpc_rows(const std::string& markdown) {
  std::vector<std::pair<int, std::string>> rows;
  static const std::regex row(R"(^\| (-32[0-9]{3}) \| ([^|]+) \|)");
  static const std::regex word(R"([a-z_]+)");
  std::istringstream lines(markdown);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, row)) continue;
    const std::string words = m[2];
    if (words.find("other") != std::string::npos) continue;  // "(other)": every code without a row of its own
    for (std::sregex_iterator w(words.begin(), words.end(), word), end; w != end; ++w) {
      rows.emplace_back(std::stoi(m[1]), w->str());
    }
  }
  return rows;
}

}  // namespace

TEST_CASE("every error code has one row, a unique name, and its name parses back", "[common][errors]") {
  std::set<std::string_view> names;
  for (std::size_t i = 0; i < accelpool::kErrcCount; ++i) {
    const auto& row = accelpool::kErrcTable[i];
    INFO(row.name);
    CHECK(static_cast<std::size_t>(row.code) == i);  // the table is indexed by the enumeration
    CHECK(names.insert(row.name).second);
    CHECK(accelpool::errc_from_name(row.name) == row.code);
    CHECK(accelpool::to_string(row.code) == row.name);
    CHECK(row.http_status >= 400);
    CHECK(row.http_status <= 599);
    CHECK(row.rpc_code <= -32000);
    CHECK(row.rpc_code >= -32768);
  }
  CHECK(names.size() == accelpool::kErrcCount);
}

TEST_CASE("merged near-duplicates are gone and unknown names are no codes", "[common][errors]") {
  CHECK_FALSE(accelpool::errc_from_name("io"));      // merged into io_error
  CHECK_FALSE(accelpool::errc_from_name("config"));  // merged into invalid_config
  CHECK(accelpool::errc_from_name("io_error") == Errc::io_error);
  CHECK(accelpool::errc_from_name("invalid_config") == Errc::invalid_config);
  CHECK_FALSE(accelpool::errc_from_name(""));
  CHECK_FALSE(accelpool::errc_from_name("Not_Found"));
}

TEST_CASE("an error read from a wire keeps a name this side does not know in its message", "[common][errors]") {
  const auto known = accelpool::error_from_wire("not_found", "no lease 7");
  CHECK(known.code == Errc::not_found);
  CHECK(known.message == "no lease 7");
  const auto unknown = accelpool::error_from_wire("gpu_melted", "device 3");
  CHECK(unknown.code == Errc::internal);
  CHECK(unknown.message == "[gpu_melted] device 3");
  CHECK(accelpool::describe(known) == "not_found: no lease 7");
}

TEST_CASE("HTTP statuses are the admin API's (docs/api/openapi.yaml)", "[common][errors]") {
  using accelpool::http_status;
  CHECK(http_status(Errc::invalid_argument) == 400);
  CHECK(http_status(Errc::unauthorized) == 401);
  CHECK(http_status(Errc::forbidden) == 403);
  CHECK(http_status(Errc::not_found) == 404);
  CHECK(http_status(Errc::method_not_allowed) == 405);
  CHECK(http_status(Errc::conflict) == 409);
  CHECK(http_status(Errc::too_large) == 413);
  CHECK(http_status(Errc::checksum_mismatch) == 422);
  CHECK(http_status(Errc::io_error) == 500);
  // The document's example of each response carries the code whose status the response has.
  const std::string doc = read_doc("docs/api/openapi.yaml");
  for (const auto& [status, code] : {std::pair{400, "invalid_argument"},
                                     {401, "unauthorized"},
                                     {403, "forbidden"},
                                     {404, "not_found"},
                                     {409, "conflict"},
                                     {413, "too_large"},
                                     {422, "checksum_mismatch"}}) {
    INFO(code);
    CHECK(doc.find("code: " + std::string(code)) != std::string::npos);
    CHECK(http_status(*accelpool::errc_from_name(code)) == status);
  }
}

TEST_CASE("JSON-RPC codes are those of the protocol documents' error tables", "[common][errors]") {
  for (const char* doc : {"docs/guest-protocol.md", "docs/agent-protocol.md"}) {
    const auto rows = rpc_rows(read_doc(doc));
    INFO(doc);
    CHECK(rows.size() >= 10);
    for (const auto& [rpc, word] : rows) {
      INFO(word);
      const auto code = accelpool::errc_from_name(word);
      REQUIRE(code);
      CHECK(accelpool::rpc_code(*code) == rpc);
    }
  }
  // Codes without a row of their own are -32000; a reply without data.code reads as its number's first word.
  CHECK(accelpool::rpc_code(Errc::program_failed) == -32000);
  CHECK(accelpool::errc_from_rpc(-32009) == Errc::invalid_state);
  CHECK(accelpool::errc_from_rpc(-32602) == Errc::invalid_argument);
  CHECK(accelpool::errc_from_rpc(-32001) == Errc::unauthorized);
  CHECK(accelpool::errc_from_rpc(-32000) == Errc::internal);
  CHECK(accelpool::errc_from_rpc(-1) == Errc::internal);
  for (const auto& row : accelpool::kErrcTable)
    CHECK(accelpool::rpc_code(accelpool::errc_from_rpc(row.rpc_code)) == row.rpc_code);
}

// Every program's command line: CLI11, one --version (the project version) and one set of exit codes.
#pragma once

#include <accelpool/common/version.hpp>

#include <CLI/CLI.hpp>

#include <optional>
#include <string>

namespace accelpool::common {

// A CLI11 app named `program` with `description` as the head of its --help, and --version printing
// "<program> <kVersion>".
inline void init_cli(CLI::App& app, const std::string& program) {
  app.name(program);
  app.set_version_flag("--version", program + " " + kVersion, "print the version and exit");
  app.set_help_flag("-h,--help", "print this help and exit");
}

// Parses the command line. Returns nothing when the program goes on, or the exit code it must return now: 0 after
// --help or --version (printed on stdout), 2 after a usage error (printed on stderr with a hint to --help).
inline std::optional<int> parse_cli(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return std::nullopt;
}

// --log-level and --log-format of a daemon (docs/operations.md "Logs"), which override its config's [log] table:
// `level` and `format` stay "" unless given, and are then names accelpool::log::parse_level / parse_format accept.
inline void add_log_options(CLI::App& app, std::string& level, std::string& format) {
  app.add_option("--log-level", level, "lowest level logged: debug, info, warn or error (overrides [log] level)")
      ->check(CLI::IsMember({"debug", "info", "warn", "error"}))
      ->type_name("LEVEL");
  app.add_option("--log-format", format, "log lines as text or json (overrides [log] format)")
      ->check(CLI::IsMember({"text", "json"}))
      ->type_name("FORMAT");
}

}  // namespace accelpool::common

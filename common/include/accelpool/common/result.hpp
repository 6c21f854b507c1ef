// Errors as values across module boundaries: Status (ok or an error) and Result<T> (a value or an error).
//
// An error has a code (Errc, <accelpool/common/errors.hpp>: one enumeration with its wire names, HTTP statuses and
// JSON-RPC codes) that callers may branch on, and a message for people that says what was wrong and where.
#pragma once

#include <accelpool/common/errors.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace accelpool {

struct Error {
  Errc code = Errc::internal;
  std::string message;
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)) {}  // NOLINT: implicit so `return Error{...};` reads well
  static Status ok() { return {}; }

  bool is_ok() const { return !error_; }
  explicit operator bool() const { return is_ok(); }
  const Error& error() const { return *error_; }

 private:
  std::optional<Error> error_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}      // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}  // NOLINT: implicit by design

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Error& error() const { return std::get<Error>(v_); }
  Status status() const { return is_ok() ? Status::ok() : Status(error()); }

 private:
  std::variant<T, Error> v_;
};

inline Error make_error(Errc code, std::string message) { return {code, std::move(message)}; }

// An error read from a wire: the code of `name`, or Errc::internal for a name this side does not know (a newer
// peer's), whose message then starts with that name so that nothing is lost.
inline Error error_from_wire(std::string_view name, std::string message) {
  if (auto code = errc_from_name(name)) return {*code, std::move(message)};
  return {Errc::internal, "[" + std::string(name) + "] " + std::move(message)};
}

// "not_found: no lease 7", for logs and test output.
inline std::string describe(const Error& error) { return std::string(to_string(error.code)) + ": " + error.message; }

}  // namespace accelpool

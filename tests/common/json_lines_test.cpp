#include <accelpool/common/json_lines.hpp>

#include <catch2/catch.hpp>

using accelpool::common::LineBuffer;

TEST_CASE("a byte stream is split into lines whatever the chunks", "[common][framing]") {
  LineBuffer in(64);
  in.append("{\"a\":1}\r\n\n{\"b\"");
  CHECK(in.next_line() == std::optional<std::string>("{\"a\":1}"));  // '\r' dropped, the empty line skipped
  CHECK_FALSE(in.next_line());                                       // "{\"b\"" is not complete yet
  in.append(":2}\n");
  CHECK(in.next_line() == std::optional<std::string>("{\"b\":2}"));
  CHECK_FALSE(in.next_line());
  CHECK_FALSE(in.overflow());
}

TEST_CASE("a line longer than the limit overflows the buffer for good", "[common][framing]") {
  LineBuffer partial(8);
  partial.append("123456789");  // no newline yet, already too long
  CHECK_FALSE(partial.next_line());
  CHECK(partial.overflow());

  LineBuffer whole(8);
  whole.append("123456789\nok\n");  // complete but too long: nothing after it is trusted
  CHECK_FALSE(whole.next_line());
  CHECK(whole.overflow());
  CHECK_FALSE(whole.next_line());
  whole.reset();
  whole.append("ok\n");
  CHECK(whole.next_line() == std::optional<std::string>("ok"));

  LineBuffer exact(8);
  exact.append("12345678\n");
  CHECK(exact.next_line() == std::optional<std::string>("12345678"));
}

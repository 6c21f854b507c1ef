// The remote OpenCL wire format (docs/remote-opencl.md): how the guest's OpenCL library (libaccelpool-opencl.so)
// and the host that serves a device (the opencl backend's remote server) frame calls and replies. Plain bytes, no
// OpenCL types: both ends include it, and neither end's SDK leaks into the other.
//
// A frame is a little-endian u32 payload length, then the payload: u16 op, u16 flags, then the op's fields in the
// order docs/remote-opencl.md lists them. A request with kWantsReply gets exactly one reply frame (op kReply: i32
// status, then the op's results); one without it gets none (its error, if any, is kept and reported by the next
// finish or wait). Replies come in request order. Both ends are 64-bit little-endian (size_t is 8 bytes).
//
// Reader never reads past its bytes: a short or malformed payload sets failed() and yields zeros, so a peer's bad
// frame is found once, where the whole request has been read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace accelpool::clwire {

inline constexpr std::uint32_t kVersion = 1;
inline constexpr std::uint32_t kMaxFrame = 1u << 30;  // 1 GiB: a larger frame is a protocol error
inline constexpr std::uint16_t kWantsReply = 1;

// What the session's objects are, for info queries and releases.
enum class Object : std::uint8_t { device = 1, context, queue, mem, program, kernel, event };

// Which clGet*Info a kGetInfo request asks (`extra` names the device or argument where the call takes one).
enum class Info : std::uint8_t {
  device = 1,
  context,
  queue,
  mem,
  program,
  program_build,
  kernel,
  kernel_work_group,
  kernel_arg,
  event,
  event_profiling
};

enum class Op : std::uint16_t {
  reply = 0,
  hello,                  // u32 version, str capability -> status
  get_info,               // u8 Info, u64 id, u32 param, u64 extra -> status, bytes value
  create_context,         // u64 new -> status
  create_queue,           // u64 new, u64 context, u64 properties -> status
  create_buffer,          // u64 new, u64 context, u64 flags, u64 size, bytes initial ("" none) -> status
  create_program_source,  // u64 new, u64 context, str source -> status
  create_program_binary,  // u64 new, u64 context, bytes binary -> status, i32 binary_status
  build_program,          // u64 program, str options -> status
  program_binary,         // u64 program -> status, bytes binary
  create_kernel,          // u64 new, u64 program, str name -> status
  create_kernels,         // u64 program, u32 n, n x u64 new -> status, u32 kernels in program
  set_kernel_arg,         // u64 kernel, u32 index, u8 ArgKind, then: bytes value | u64 mem | u64 local size
  write_buffer,           // u64 queue, u64 mem, u64 offset, waits, u64 event, bytes data
  read_buffer,            // u64 queue, u64 mem, u64 offset, u64 size, waits, u64 event -> status, bytes data
  copy_buffer,            // u64 queue, u64 src, u64 dst, u64 src_offset, u64 dst_offset, u64 size, waits, u64 event
  fill_buffer,            // u64 queue, u64 mem, bytes pattern, u64 offset, u64 size, waits, u64 event
  ndrange,                // u64 queue, u64 kernel, u32 dims, dims x u64 offset, dims x u64 global, u8 has_local,
                          // [dims x u64 local], waits, u64 event
  marker,                 // u64 queue, waits, u64 event (a marker with a wait list)
  barrier,                // u64 queue, waits, u64 event
  flush,                  // u64 queue
  finish,                 // u64 queue -> status (or the first kept error)
  wait_events,            // waits -> status (or the first kept error)
  release,                // u8 Object, u64 id
};
// "waits" is u32 n, then n x u64 event ids.

enum class ArgKind : std::uint8_t { value = 1, mem, local, null_mem };

// Appends fields to a payload.
class Writer {
 public:
  // `reuse`: a buffer whose memory the frame takes over (a big frame in fresh memory costs a page fault per page;
  // a sender that keeps its buffer across frames, take() then the next Writer, pays them once).
  explicit Writer(Op op, std::uint16_t flags = 0, std::string&& reuse = {}) : buf_(std::move(reuse)) {
    buf_.clear();
    u32(0);  // the frame length, set by frame()
    u16(static_cast<std::uint16_t>(op));
    u16(flags);
  }
  Writer& u8(std::uint8_t v) { return raw(&v, 1); }
  Writer& u16(std::uint16_t v) { return raw(&v, 2); }
  Writer& u32(std::uint32_t v) { return raw(&v, 4); }
  Writer& i32(std::int32_t v) { return raw(&v, 4); }
  Writer& u64(std::uint64_t v) { return raw(&v, 8); }
  Writer& bytes(const void* data, std::size_t size) {
    u64(size);
    return raw(data, size);
  }
  Writer& str(std::string_view s) { return bytes(s.data(), s.size()); }
  Writer& ids(const std::vector<std::uint64_t>& v) {
    u32(static_cast<std::uint32_t>(v.size()));
    for (auto id : v) u64(id);
    return *this;
  }
  // Appends a length-prefixed byte string of `size` bytes to be filled in place; returns where they start (valid
  // until the next append).
  char* bytes_in_place(std::size_t size) {
    u64(size);
    buf_.resize(buf_.size() + size);
    return buf_.data() + buf_.size() - size;
  }
  // Drops what was appended after the first `size` bytes of the frame.
  void truncate(std::size_t size) { buf_.resize(size); }
  std::size_t size() const { return buf_.size(); }
  // Overwrites the i32 at byte `at` of the frame (a field written before its value was known).
  void set_i32(std::size_t at, std::int32_t v) { std::memcpy(buf_.data() + at, &v, 4); }
  // The whole frame, its length set. `tail`: bytes the sender writes right after these, as the frame's last field
  // (the data of a bytes() field whose length u64 ends this buffer), so bulk data goes from where it is.
  std::string& frame(std::size_t tail = 0) {
    const auto n = static_cast<std::uint32_t>(buf_.size() - 4 + tail);
    std::memcpy(buf_.data(), &n, 4);
    return buf_;
  }
  // The buffer, for the next Writer to reuse.
  std::string take() { return std::move(buf_); }

 private:
  Writer& raw(const void* p, std::size_t n) {
    buf_.append(static_cast<const char*>(p), n);
    return *this;
  }
  std::string buf_;
};

// Reads fields from a payload (the bytes after the frame length).
class Reader {
 public:
  explicit Reader(std::string_view payload) : p_(payload) {}
  std::uint8_t u8() { return scalar<std::uint8_t>(); }
  std::uint16_t u16() { return scalar<std::uint16_t>(); }
  std::uint32_t u32() { return scalar<std::uint32_t>(); }
  std::int32_t i32() { return scalar<std::int32_t>(); }
  std::uint64_t u64() { return scalar<std::uint64_t>(); }
  // A length-prefixed byte string, viewed in place (valid while the payload is).
  std::string_view bytes() {
    const std::uint64_t n = u64();
    if (failed_ || n > p_.size() - at_) {
      failed_ = true;
      return {};
    }
    std::string_view v = p_.substr(at_, n);
    at_ += n;
    return v;
  }
  std::vector<std::uint64_t> ids() {
    const std::uint32_t n = u32();
    std::vector<std::uint64_t> v;
    if (failed_ || n > (p_.size() - at_) / 8) {
      failed_ = true;
      return v;
    }
    v.reserve(n);
    for (std::uint32_t i = 0; i < n; ++i) v.push_back(u64());
    return v;
  }
  bool failed() const { return failed_; }
  bool at_end() const { return at_ == p_.size(); }

 private:
  template <typename T>
  T scalar() {
    T v{};
    if (failed_ || sizeof(T) > p_.size() - at_) {
      failed_ = true;
      return v;
    }
    std::memcpy(&v, p_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  std::string_view p_;
  std::size_t at_ = 0;
  bool failed_ = false;
};

// The parts of an endpoint "ocl+tcp://HOST:PORT/CAPABILITY", or "ocl+tls://..." for TLS (docs/remote-opencl.md).
// False when `text` is not one.
struct Endpoint {
  std::string host, port, capability;
  bool tls = false;
};
inline bool parse_endpoint(std::string_view text, Endpoint& out) {
  constexpr std::string_view plain = "ocl+tcp://", secure = "ocl+tls://";
  out.tls = text.substr(0, secure.size()) == secure;
  if (!out.tls && text.substr(0, plain.size()) != plain) return false;
  text.remove_prefix(plain.size());
  const auto slash = text.find('/');
  if (slash == std::string_view::npos) return false;
  const std::string_view address = text.substr(0, slash);
  const auto colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == address.size()) return false;
  out.host = std::string(address.substr(0, colon));
  if (out.host.size() > 2 && out.host.front() == '[' && out.host.back() == ']')
    out.host = out.host.substr(1, out.host.size() - 2);
  out.port = std::string(address.substr(colon + 1));
  out.capability = std::string(text.substr(slash + 1));
  return !out.capability.empty();
}

}  // namespace accelpool::clwire

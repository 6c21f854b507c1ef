#include "remote_server.hpp"

#include <accelpool/common/cl_socket.hpp>
#include <accelpool/common/cl_wire.hpp>
#include <accelpool/common/tls.hpp>

#include <openssl/ssl.h>

#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

namespace accelpool::backends {
namespace {

using clwire::Info;
using clwire::Object;
using clwire::Op;
using clwire::Reader;
using clwire::Writer;

// "HOST:PORT" split at its last colon; "[::1]:7" gives "::1".
bool split_address(const std::string& address, std::string& host, std::string& port) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) return false;
  host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  port = address.substr(colon + 1);
  return true;
}

std::string random_capability() {
  std::random_device rd;
  static constexpr char hex[] = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 16; ++i) {
    const std::uint32_t v = rd();
    for (int b = 0; b < 4; ++b) s += hex[(v >> (b * 4)) & 0xf];
  }
  return s;
}

// One connection's bytes: plain TCP, or TLS over it (`ssl` set once its handshake is done).
struct Channel {
  int fd = -1;
  SSL* ssl = nullptr;

  bool read(char* p, std::size_t n) const {
    if (ssl == nullptr) return clwire::read_exact(fd, p, n);
    return clwire::move_all([this](char* at, std::size_t left) { return SSL_read(ssl, at, chunk(left)); }, p, n);
  }
  bool write(const char* p, std::size_t n) const {
    if (ssl == nullptr) return clwire::write_all(fd, p, n);
    return clwire::move_all([this](const char* at, std::size_t left) { return SSL_write(ssl, at, chunk(left)); }, p, n);
  }
  // Reads one frame's payload of at most `limit` bytes into `buffer`, which only grows (a big frame after small ones
  // is not zero-filled again), and returns where it is. nullopt when the connection ended or the frame is too big.
  std::optional<std::string_view> read_frame(std::string& buffer, std::uint32_t limit) const {
    std::uint32_t size = 0;
    if (!read(reinterpret_cast<char*>(&size), 4) || size < 4 || size > limit) return std::nullopt;
    if (buffer.size() < size) buffer.resize(size);
    if (!read(buffer.data(), size)) return std::nullopt;
    return std::string_view(buffer.data(), size);
  }

 private:
  static int chunk(std::size_t n) { return static_cast<int>(std::min<std::size_t>(n, 1u << 30)); }
};

// Runs one connection's calls on its device, in order, and keeps what they made until the connection ends.
class Session {
 public:
  Session(const Channel& channel, cl_device_id device) : channel_(channel), device_(device) {}

  // Serves frames until the peer leaves or the connection is cut, then releases every object.
  void serve() {
    std::string buffer;
    for (auto payload = channel_.read_frame(buffer, clwire::kMaxFrame); payload && handle(*payload);
         payload = channel_.read_frame(buffer, clwire::kMaxFrame)) {
    }
    release_all();
  }

 private:
  struct Held {
    Object type;
    void* handle;
  };

  template <typename T>
  T find(std::uint64_t id, Object type) {
    auto it = objects_.find(id);
    return it != objects_.end() && it->second.type == type ? static_cast<T>(it->second.handle) : nullptr;
  }
  void keep(std::uint64_t id, Object type, void* handle) {
    if (id != 0 && handle != nullptr) objects_[id] = {type, handle};
  }
  // The events `ids` name; false when one is unknown.
  bool events(const std::vector<std::uint64_t>& ids, std::vector<cl_event>& out) {
    for (auto id : ids) {
      auto e = find<cl_event>(id, Object::event);
      if (e == nullptr) return false;
      out.push_back(e);
    }
    return true;
  }

  // One request. False ends the connection (a malformed frame or a failed reply).
  bool handle(std::string_view payload) {
    Reader r(payload);
    const auto op = static_cast<Op>(r.u16());
    const bool wants_reply = (r.u16() & clwire::kWantsReply) != 0;
    Writer out(Op::reply, 0, std::move(reply_buffer_));
    constexpr std::size_t kStatusAt = 8;  // after the frame length, op and flags
    out.i32(CL_SUCCESS);
    cl_int status = run(op, r, out);
    bool ok = !r.failed() && r.at_end();
    if (ok && !wants_reply) {
      if (status != CL_SUCCESS && kept_ == CL_SUCCESS) kept_ = status;
    } else if (ok) {
      out.set_i32(kStatusAt, status);
      const std::string& frame = out.frame(tail_.size());
      ok = channel_.write(frame.data(), frame.size()) && channel_.write(tail_.data(), tail_.size());
    }
    if (unmap_) unmap_();
    unmap_ = nullptr;
    tail_ = {};
    reply_buffer_ = out.take();
    return ok;
  }

  // Runs `op` with the fields `r` holds; results go to `out`. Returns the OpenCL status.
  cl_int run(Op op, Reader& r, Writer& out) {
    switch (op) {
      case Op::get_info:
        return get_info(r, out);
      case Op::create_context: {
        const auto id = r.u64();
        cl_int err = CL_SUCCESS;
        cl_context c = clCreateContext(nullptr, 1, &device_, nullptr, nullptr, &err);
        keep(id, Object::context, c);
        return err;
      }
      case Op::create_queue: {
        const auto id = r.u64();
        auto c = find<cl_context>(r.u64(), Object::context);
        const auto props = r.u64();
        if (c == nullptr) return CL_INVALID_CONTEXT;
        cl_int err = CL_SUCCESS;
        cl_command_queue q = clCreateCommandQueue(c, device_, props, &err);
        keep(id, Object::queue, q);
        return err;
      }
      case Op::create_buffer: {
        const auto id = r.u64();
        auto c = find<cl_context>(r.u64(), Object::context);
        auto flags = r.u64();
        const auto size = r.u64();
        auto initial = r.bytes();
        if (c == nullptr) return CL_INVALID_CONTEXT;
        flags &= ~static_cast<std::uint64_t>(CL_MEM_USE_HOST_PTR | CL_MEM_ALLOC_HOST_PTR | CL_MEM_COPY_HOST_PTR);
        if (!initial.empty()) {
          if (initial.size() != size) return CL_INVALID_VALUE;
          flags |= CL_MEM_COPY_HOST_PTR;
        }
        cl_int err = CL_SUCCESS;
        cl_mem m = clCreateBuffer(c, flags, size, initial.empty() ? nullptr : const_cast<char*>(initial.data()), &err);
        keep(id, Object::mem, m);
        return err;
      }
      case Op::create_program_source: {
        const auto id = r.u64();
        auto c = find<cl_context>(r.u64(), Object::context);
        auto source = r.bytes();
        if (c == nullptr) return CL_INVALID_CONTEXT;
        const char* text = source.data();
        std::size_t length = source.size();
        cl_int err = CL_SUCCESS;
        cl_program p = clCreateProgramWithSource(c, 1, &text, &length, &err);
        keep(id, Object::program, p);
        return err;
      }
      case Op::create_program_binary: {
        const auto id = r.u64();
        auto c = find<cl_context>(r.u64(), Object::context);
        auto binary = r.bytes();
        if (c == nullptr) return CL_INVALID_CONTEXT;
        const auto* bytes = reinterpret_cast<const unsigned char*>(binary.data());
        std::size_t length = binary.size();
        cl_int err = CL_SUCCESS, binary_status = CL_SUCCESS;
        cl_program p = clCreateProgramWithBinary(c, 1, &device_, &length, &bytes, &binary_status, &err);
        keep(id, Object::program, p);
        out.i32(binary_status);
        return err;
      }
      case Op::build_program: {
        auto p = find<cl_program>(r.u64(), Object::program);
        const std::string options(r.bytes());
        if (p == nullptr) return CL_INVALID_PROGRAM;
        return clBuildProgram(p, 1, &device_, options.c_str(), nullptr, nullptr);
      }
      case Op::program_binary:
        return program_binary(r, out);
      case Op::create_kernel: {
        const auto id = r.u64();
        auto p = find<cl_program>(r.u64(), Object::program);
        const std::string name(r.bytes());
        if (p == nullptr) return CL_INVALID_PROGRAM;
        cl_int err = CL_SUCCESS;
        cl_kernel k = clCreateKernel(p, name.c_str(), &err);
        keep(id, Object::kernel, k);
        return err;
      }
      case Op::create_kernels: {
        auto p = find<cl_program>(r.u64(), Object::program);
        auto ids = r.ids();
        if (p == nullptr) return CL_INVALID_PROGRAM;
        cl_uint n = 0;
        std::vector<cl_kernel> made(ids.size());
        cl_int err =
            clCreateKernelsInProgram(p, static_cast<cl_uint>(made.size()), made.empty() ? nullptr : made.data(), &n);
        if (err == CL_SUCCESS && !ids.empty()) {
          for (cl_uint i = 0; i < n && i < ids.size(); ++i) keep(ids[i], Object::kernel, made[i]);
        }
        out.u32(n);
        return err;
      }
      case Op::set_kernel_arg:
        return set_kernel_arg(r);
      default:
        return run_queue_op(op, r, out);
    }
  }

  cl_int run_queue_op(Op op, Reader& r, Writer& out) {
    switch (op) {
      case Op::write_buffer: {
        auto q = find<cl_command_queue>(r.u64(), Object::queue);
        auto m = find<cl_mem>(r.u64(), Object::mem);
        const auto offset = r.u64();
        auto wait_ids = r.ids();
        const auto event_id = r.u64();
        auto data = r.bytes();  // last: the sender writes it from where it is
        return enqueue(wait_ids, event_id, r, q, [&](cl_uint n, const cl_event* w, cl_event* e) {
          return m == nullptr ? CL_INVALID_MEM_OBJECT
                              : clEnqueueWriteBuffer(q, m, CL_TRUE, offset, data.size(), data.data(), n, w, e);
        });
      }
      case Op::read_buffer: {
        auto q = find<cl_command_queue>(r.u64(), Object::queue);
        auto m = find<cl_mem>(r.u64(), Object::mem);
        const auto offset = r.u64();
        const auto size = r.u64();
        // The data goes out from the buffer mapped for reading, as the reply's tail (no copy here), then it is
        // unmapped (handle()).
        void* mapped = nullptr;
        cl_int status = enqueue(r, q, [&](cl_uint n, const cl_event* w, cl_event* e) {
          if (m == nullptr) return CL_INVALID_MEM_OBJECT;
          if (size > clwire::kMaxFrame - 64) return CL_INVALID_VALUE;
          cl_int err = CL_SUCCESS;
          mapped = clEnqueueMapBuffer(q, m, CL_TRUE, CL_MAP_READ, offset, size, n, w, e, &err);
          return err;
        });
        out.u64(status == CL_SUCCESS ? size : 0);
        if (status == CL_SUCCESS) {
          tail_ = std::string_view(static_cast<const char*>(mapped), size);
          unmap_ = [q, m, mapped] { clEnqueueUnmapMemObject(q, m, mapped, 0, nullptr, nullptr); };
        }
        return status;
      }
      case Op::copy_buffer: {
        auto q = find<cl_command_queue>(r.u64(), Object::queue);
        auto src = find<cl_mem>(r.u64(), Object::mem);
        auto dst = find<cl_mem>(r.u64(), Object::mem);
        const auto src_offset = r.u64(), dst_offset = r.u64(), size = r.u64();
        return enqueue(r, q, [&](cl_uint n, const cl_event* w, cl_event* e) {
          return src == nullptr || dst == nullptr
                     ? CL_INVALID_MEM_OBJECT
                     : clEnqueueCopyBuffer(q, src, dst, src_offset, dst_offset, size, n, w, e);
        });
      }
      case Op::fill_buffer: {
        auto q = find<cl_command_queue>(r.u64(), Object::queue);
        auto m = find<cl_mem>(r.u64(), Object::mem);
        auto pattern = r.bytes();
        const auto offset = r.u64(), size = r.u64();
        return enqueue(r, q, [&](cl_uint n, const cl_event* w, cl_event* e) {
          return m == nullptr ? CL_INVALID_MEM_OBJECT
                              : clEnqueueFillBuffer(q, m, pattern.data(), pattern.size(), offset, size, n, w, e);
        });
      }
      case Op::ndrange:
        return ndrange(r);
      case Op::marker:
      case Op::barrier: {
        auto q = find<cl_command_queue>(r.u64(), Object::queue);
        return enqueue(r, q, [&](cl_uint n, const cl_event* w, cl_event* e) {
          return op == Op::marker ? clEnqueueMarkerWithWaitList(q, n, w, e) : clEnqueueBarrierWithWaitList(q, n, w, e);
        });
      }
      case Op::flush: {
        auto q = find<cl_command_queue>(r.u64(), Object::queue);
        return q == nullptr ? CL_INVALID_COMMAND_QUEUE : clFlush(q);
      }
      case Op::finish: {
        auto q = find<cl_command_queue>(r.u64(), Object::queue);
        cl_int err = q == nullptr ? CL_INVALID_COMMAND_QUEUE : clFinish(q);
        return take_kept(err);
      }
      case Op::wait_events: {
        std::vector<cl_event> list;
        if (!events(r.ids(), list)) return take_kept(CL_INVALID_EVENT);
        return take_kept(list.empty() ? CL_INVALID_VALUE
                                      : clWaitForEvents(static_cast<cl_uint>(list.size()), list.data()));
      }
      case Op::release: {
        const auto type = static_cast<Object>(r.u8());
        const auto id = r.u64();
        auto it = objects_.find(id);
        if (it == objects_.end() || it->second.type != type) return CL_INVALID_VALUE;
        release(it->second);
        objects_.erase(it);
        return CL_SUCCESS;
      }
      default:
        r.u64();  // an unknown op: the frame is malformed
        return CL_INVALID_OPERATION;
    }
  }

  // The first error kept from a request without a reply, else `status`; the kept one is then forgotten.
  cl_int take_kept(cl_int status) {
    if (kept_ == CL_SUCCESS) return status;
    cl_int k = kept_;
    kept_ = CL_SUCCESS;
    return k;
  }

  // Reads an enqueue's wait list and event id, runs `call` with them and keeps the event it made.
  template <typename Call>
  cl_int enqueue(Reader& r, cl_command_queue q, Call call) {
    auto wait_ids = r.ids();
    const auto event_id = r.u64();
    return enqueue(wait_ids, event_id, r, q, call);
  }

  // Runs `call` with the events `wait_ids` names and keeps the event it made as `event_id` (when `r` read well).
  template <typename Call>
  cl_int enqueue(const std::vector<std::uint64_t>& wait_ids, std::uint64_t event_id, const Reader& r,
                 cl_command_queue q, Call call) {
    if (r.failed()) return CL_INVALID_VALUE;
    if (q == nullptr) return CL_INVALID_COMMAND_QUEUE;
    std::vector<cl_event> waits;
    if (!events(wait_ids, waits)) return CL_INVALID_EVENT_WAIT_LIST;
    cl_event made = nullptr;
    cl_int err = call(static_cast<cl_uint>(waits.size()), waits.empty() ? nullptr : waits.data(),
                      event_id != 0 ? &made : nullptr);
    if (err == CL_SUCCESS) keep(event_id, Object::event, made);
    return err;
  }

  cl_int ndrange(Reader& r) {
    auto q = find<cl_command_queue>(r.u64(), Object::queue);
    auto k = find<cl_kernel>(r.u64(), Object::kernel);
    const auto dims = r.u32();
    if (dims < 1 || dims > 3) {
      r.u64();  // malformed
      return CL_INVALID_WORK_DIMENSION;
    }
    std::size_t offset[3], global[3], local[3];
    for (cl_uint d = 0; d < dims; ++d) offset[d] = r.u64();
    for (cl_uint d = 0; d < dims; ++d) global[d] = r.u64();
    const bool has_local = r.u8() != 0;
    if (has_local) {
      for (cl_uint d = 0; d < dims; ++d) local[d] = r.u64();
    }
    return enqueue(r, q, [&](cl_uint n, const cl_event* w, cl_event* e) {
      return k == nullptr ? CL_INVALID_KERNEL
                          : clEnqueueNDRangeKernel(q, k, dims, offset, global, has_local ? local : nullptr, n, w, e);
    });
  }

  cl_int set_kernel_arg(Reader& r) {
    auto k = find<cl_kernel>(r.u64(), Object::kernel);
    const auto index = r.u32();
    const auto kind = static_cast<clwire::ArgKind>(r.u8());
    switch (kind) {
      case clwire::ArgKind::value: {
        auto value = r.bytes();
        return k == nullptr ? CL_INVALID_KERNEL : clSetKernelArg(k, index, value.size(), value.data());
      }
      case clwire::ArgKind::mem: {
        auto m = find<cl_mem>(r.u64(), Object::mem);
        if (k == nullptr) return CL_INVALID_KERNEL;
        return m == nullptr ? CL_INVALID_MEM_OBJECT : clSetKernelArg(k, index, sizeof m, &m);
      }
      case clwire::ArgKind::local: {
        const auto size = r.u64();
        return k == nullptr ? CL_INVALID_KERNEL : clSetKernelArg(k, index, size, nullptr);
      }
      case clwire::ArgKind::null_mem: {
        cl_mem none = nullptr;
        return k == nullptr ? CL_INVALID_KERNEL : clSetKernelArg(k, index, sizeof none, &none);
      }
    }
    r.u64();  // an unknown kind: malformed
    return CL_INVALID_VALUE;
  }

  // A clGet*Info call: `query(size, value, size_ret)`; the value goes to `out` as bytes.
  template <typename Query>
  static cl_int answer(Writer& out, Query query) {
    std::size_t size = 0;
    cl_int err = query(0, nullptr, &size);
    std::string value(err == CL_SUCCESS ? size : 0, '\0');
    if (err == CL_SUCCESS && size > 0) err = query(size, value.data(), nullptr);
    if (err != CL_SUCCESS) value.clear();
    out.str(value);
    return err;
  }

  cl_int get_info(Reader& r, Writer& out) {
    const auto what = static_cast<Info>(r.u8());
    const auto id = r.u64();
    const auto param = r.u32();
    const auto extra = r.u64();
    auto missing = [&](cl_int err) {
      out.str("");
      return err;
    };
    switch (what) {
      case Info::device:
        return answer(out,
                      [&](std::size_t s, void* v, std::size_t* n) { return clGetDeviceInfo(device_, param, s, v, n); });
      case Info::context: {
        auto c = find<cl_context>(id, Object::context);
        if (c == nullptr) return missing(CL_INVALID_CONTEXT);
        return answer(out, [&](std::size_t s, void* v, std::size_t* n) { return clGetContextInfo(c, param, s, v, n); });
      }
      case Info::queue: {
        auto q = find<cl_command_queue>(id, Object::queue);
        if (q == nullptr) return missing(CL_INVALID_COMMAND_QUEUE);
        return answer(out,
                      [&](std::size_t s, void* v, std::size_t* n) { return clGetCommandQueueInfo(q, param, s, v, n); });
      }
      case Info::mem: {
        auto m = find<cl_mem>(id, Object::mem);
        if (m == nullptr) return missing(CL_INVALID_MEM_OBJECT);
        return answer(out,
                      [&](std::size_t s, void* v, std::size_t* n) { return clGetMemObjectInfo(m, param, s, v, n); });
      }
      case Info::program:
      case Info::program_build: {
        auto p = find<cl_program>(id, Object::program);
        if (p == nullptr) return missing(CL_INVALID_PROGRAM);
        if (what == Info::program)
          return answer(out,
                        [&](std::size_t s, void* v, std::size_t* n) { return clGetProgramInfo(p, param, s, v, n); });
        return answer(out, [&](std::size_t s, void* v, std::size_t* n) {
          return clGetProgramBuildInfo(p, device_, param, s, v, n);
        });
      }
      case Info::kernel:
      case Info::kernel_work_group:
      case Info::kernel_arg: {
        auto k = find<cl_kernel>(id, Object::kernel);
        if (k == nullptr) return missing(CL_INVALID_KERNEL);
        if (what == Info::kernel)
          return answer(out,
                        [&](std::size_t s, void* v, std::size_t* n) { return clGetKernelInfo(k, param, s, v, n); });
        if (what == Info::kernel_arg)
          return answer(out, [&](std::size_t s, void* v, std::size_t* n) {
            return clGetKernelArgInfo(k, static_cast<cl_uint>(extra), param, s, v, n);
          });
        return answer(out, [&](std::size_t s, void* v, std::size_t* n) {
          return clGetKernelWorkGroupInfo(k, device_, param, s, v, n);
        });
      }
      case Info::event:
      case Info::event_profiling: {
        auto e = find<cl_event>(id, Object::event);
        if (e == nullptr) return missing(CL_INVALID_EVENT);
        if (what == Info::event)
          return answer(out, [&](std::size_t s, void* v, std::size_t* n) { return clGetEventInfo(e, param, s, v, n); });
        return answer(
            out, [&](std::size_t s, void* v, std::size_t* n) { return clGetEventProfilingInfo(e, param, s, v, n); });
      }
    }
    return missing(CL_INVALID_VALUE);
  }

  cl_int program_binary(Reader& r, Writer& out) {
    auto p = find<cl_program>(r.u64(), Object::program);
    std::string binary;
    cl_int err = CL_INVALID_PROGRAM;
    if (p != nullptr) {
      std::size_t size = 0;
      err = clGetProgramInfo(p, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, nullptr);
      if (err == CL_SUCCESS) {
        binary.resize(size);
        unsigned char* at = reinterpret_cast<unsigned char*>(binary.data());
        err = clGetProgramInfo(p, CL_PROGRAM_BINARIES, sizeof at, &at, nullptr);
      }
    }
    if (err != CL_SUCCESS) binary.clear();
    out.str(binary);
    return err;
  }

  static void release(const Held& h) {
    switch (h.type) {
      case Object::context:
        clReleaseContext(static_cast<cl_context>(h.handle));
        break;
      case Object::queue:
        clReleaseCommandQueue(static_cast<cl_command_queue>(h.handle));
        break;
      case Object::mem:
        clReleaseMemObject(static_cast<cl_mem>(h.handle));
        break;
      case Object::program:
        clReleaseProgram(static_cast<cl_program>(h.handle));
        break;
      case Object::kernel:
        clReleaseKernel(static_cast<cl_kernel>(h.handle));
        break;
      case Object::event:
        clReleaseEvent(static_cast<cl_event>(h.handle));
        break;
      case Object::device:
        break;
    }
  }

  // Waits for every queue, then releases what the connection made, children before their parents.
  void release_all() {
    for (auto& [id, h] : objects_) {
      if (h.type == Object::queue) clFinish(static_cast<cl_command_queue>(h.handle));
    }
    for (Object type : {Object::event, Object::kernel, Object::program, Object::mem, Object::queue, Object::context}) {
      for (auto& [id, h] : objects_) {
        if (h.type == type) release(h);
      }
    }
    objects_.clear();
  }

  const Channel& channel_;
  cl_device_id device_;
  std::string reply_buffer_;     // kept across replies: a big reply does not fault in fresh pages each time
  std::string_view tail_;        // sent after the reply: a read's data, from the buffer mapped for it
  std::function<void()> unmap_;  // ends that mapping once the data is sent
  std::unordered_map<std::uint64_t, Held> objects_;
  cl_int kept_ = CL_SUCCESS;
};

}  // namespace

struct RemoteServer::Impl {
  struct Open {
    std::string capability;
    cl_device_id device = nullptr;
  };
  struct Connection {
    int fd = -1;
    std::string local_id;  // "" until its capability was checked
    std::thread thread;
    std::atomic<bool> done{false};
  };

  static constexpr std::chrono::seconds kGreetingTimeout{10};
  common::tls::Context tls;  // null: plain TCP
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  std::string bound, advertised;
  std::function<void(const std::string&)> log;
  std::thread acceptor;

  std::mutex mu;
  std::map<std::string, Open> open;  // local id -> its lease's capability
  std::list<Connection> connections;

  void say(const std::string& line) {
    if (log) log("remote opencl: " + line);
  }

  void accept_loop() {
    for (;;) {
      pollfd fds[2] = {{listen_fd, POLLIN, 0}, {wake[0], POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0 && errno != EINTR) return;
      if (fds[1].revents != 0) return;
      if ((fds[0].revents & POLLIN) == 0) continue;
      int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      clwire::tune_socket(fd);
      reap();
      std::lock_guard lock(mu);
      Connection& c = connections.emplace_back();
      c.fd = fd;
      c.thread = std::thread([this, &c] { serve(c); });
    }
  }

  // Joins connections that ended by themselves.
  void reap() {
    std::list<Connection> ended;
    {
      std::lock_guard lock(mu);
      for (auto it = connections.begin(); it != connections.end();) {
        auto next = std::next(it);
        if (it->done) ended.splice(ended.end(), connections, it);
        it = next;
      }
    }
    for (auto& c : ended) {
      c.thread.join();
      ::close(c.fd);
    }
  }

  // With TLS the handshake comes first; then the first frame must be a hello with an open capability, within
  // kGreetingTimeout (a peer that says nothing holds no thread for long); then the session runs.
  void serve(Connection& c) {
    Channel channel{c.fd, nullptr};
    std::unique_ptr<SSL, decltype(&SSL_free)> ssl(nullptr, SSL_free);
    timeval limit{kGreetingTimeout.count(), 0};
    ::setsockopt(c.fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    ::setsockopt(c.fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
    bool ready = true;
    if (tls) {
      ssl.reset(SSL_new(tls.get()));
      ready = ssl && SSL_set_fd(ssl.get(), c.fd) == 1 && SSL_accept(ssl.get()) == 1;
      channel.ssl = ssl.get();
      if (!ready) say("a TLS handshake failed: " + common::tls::last_error("the peer left"));
    }
    cl_device_id device = nullptr;
    cl_int status = CL_INVALID_VALUE;
    std::string payload;
    std::optional<std::string_view> hello;
    if (ready && (hello = channel.read_frame(payload, 4096))) {
      Reader r(*hello);
      const auto op = static_cast<Op>(r.u16());
      r.u16();
      const auto version = r.u32();
      const std::string capability(r.bytes());
      std::lock_guard lock(mu);
      for (auto& [id, o] : open) {
        if (!capability.empty() && o.capability == capability) {
          c.local_id = id;
          device = o.device;
        }
      }
      if (op != Op::hello || r.failed() || version != clwire::kVersion) device = nullptr;
      status = op != Op::hello || r.failed() || version != clwire::kVersion ? CL_INVALID_VALUE
               : device != nullptr                                          ? CL_SUCCESS
                                                                            : CL_INVALID_DEVICE;
    }
    Writer w(Op::reply);
    w.i32(status);
    const bool greeted = ready && channel.write(w.frame().data(), w.frame().size());
    if (device != nullptr && greeted) {
      timeval none{0, 0};  // from here a program may think as long as it likes between calls
      ::setsockopt(c.fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
      ::setsockopt(c.fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none);
      say("a program connected to " + c.local_id);
      Session(channel, device).serve();
      say("a program's connection to " + c.local_id + " ended; its objects are released");
    } else if (ready && status != CL_SUCCESS) {
      say("refused a connection that presented no open capability");
    }
    ::shutdown(c.fd, SHUT_RDWR);
    c.done = true;
  }

  // Cuts the connections of `local_id` (every one when empty) and joins them.
  void cut(const std::string& local_id, bool all) {
    std::list<Connection> ending;
    {
      std::lock_guard lock(mu);
      for (auto it = connections.begin(); it != connections.end();) {
        auto next = std::next(it);
        if (all || it->local_id == local_id) {
          ::shutdown(it->fd, SHUT_RDWR);
          ending.splice(ending.end(), connections, it);
        }
        it = next;
      }
    }
    for (auto& c : ending) {
      c.thread.join();
      ::close(c.fd);
    }
  }
};

RemoteServer::RemoteServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RemoteServer::~RemoteServer() {
  if (impl_->wake[1] >= 0) (void)!::write(impl_->wake[1], "x", 1);
  if (impl_->acceptor.joinable()) impl_->acceptor.join();
  impl_->cut("", true);
  for (int fd : {impl_->listen_fd, impl_->wake[0], impl_->wake[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

Result<std::unique_ptr<RemoteServer>> RemoteServer::start(const std::string& listen, const std::string& advertise,
                                                          common::tls::Context tls,
                                                          std::function<void(const std::string&)> log) {
  std::string host, port;
  if (!split_address(listen, host, port))
    return make_error(Errc::invalid_argument, "remote opencl: listen address '" + listen + "' is not HOST:PORT");
  std::string ahost, aport;
  if (!advertise.empty() && !split_address(advertise, ahost, aport))
    return make_error(Errc::invalid_argument, "remote opencl: advertised address '" + advertise + "' is not HOST:PORT");
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0)
    return make_error(Errc::invalid_argument, "remote opencl: listen address '" + listen + "': " + gai_strerror(rc));
  auto impl = std::make_unique<Impl>();
  impl->log = std::move(log);
  impl->tls = std::move(tls);
  int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const bool bound = fd >= 0 && ::bind(fd, found->ai_addr, found->ai_addrlen) == 0 && ::listen(fd, 64) == 0;
  const int bind_errno = errno;
  ::freeaddrinfo(found);
  if (!bound) {
    if (fd >= 0) ::close(fd);
    return make_error(Errc::io_error, "remote opencl: cannot listen on " + listen + ": " + std::strerror(bind_errno));
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  char name[NI_MAXHOST], service[NI_MAXSERV];
  ::getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, name, sizeof name, service, sizeof service,
                NI_NUMERICHOST | NI_NUMERICSERV);
  const std::string shown = std::string(name).find(':') != std::string::npos ? "[" + std::string(name) + "]" : name;
  impl->bound = shown + ":" + service;
  impl->advertised = advertise.empty() ? impl->bound : advertise;
  if (advertise.empty() && (std::string(name) == "0.0.0.0" || std::string(name) == "::")) {
    ::close(fd);
    return make_error(Errc::invalid_argument, "remote opencl: listening on the wildcard " + listen +
                                                  " needs an advertised address (remote_advertise) that guests reach");
  }
  impl->listen_fd = fd;
  if (::pipe2(impl->wake, O_CLOEXEC) != 0) {
    ::close(fd);
    return make_error(Errc::io_error, std::string("remote opencl: pipe: ") + std::strerror(errno));
  }
  Impl* raw = impl.get();
  impl->acceptor = std::thread([raw] { raw->accept_loop(); });
  return std::unique_ptr<RemoteServer>(new RemoteServer(std::move(impl)));
}

std::string RemoteServer::open(const std::string& local_id, void* device) {
  close(local_id);
  const std::string capability = random_capability();
  {
    std::lock_guard lock(impl_->mu);
    impl_->open[local_id] = {capability, static_cast<cl_device_id>(device)};
  }
  return std::string(impl_->tls ? "ocl+tls://" : "ocl+tcp://") + impl_->advertised + "/" + capability;
}

void RemoteServer::close(const std::string& local_id) {
  {
    std::lock_guard lock(impl_->mu);
    impl_->open.erase(local_id);
  }
  impl_->cut(local_id, false);
  impl_->reap();
}

std::string RemoteServer::address() const { return impl_->bound; }

}  // namespace accelpool::backends

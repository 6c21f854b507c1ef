// libaccelpool-opencl.so: an OpenCL installable client driver (ICD) whose one platform, "accelpool", shows the
// device the pool granted this process and runs every call on it through the device's host (docs/remote-opencl.md).
// The ICD loader (ocl-icd) finds it through an /etc/OpenCL/vendors/*.icd file (or OCL_ICD_VENDORS) and calls it
// through the dispatch table every object starts with; only clIcdGetPlatformIDsKHR and
// clGetExtensionFunctionAddress are exported.
//
// The platform speaks OpenCL 1.2 buffers, programs, kernels, queues and events; calls outside it (images, samplers,
// SVM, pipes, sub-devices, user events, callbacks on events) return CL_INVALID_OPERATION. Requests whose errors
// OpenCL lets a program find later (non-blocking enqueues, kernel arguments, releases) are sent in batches without
// waiting; their first error is returned by the next clFinish or clWaitForEvents.
#define CL_TARGET_OPENCL_VERSION 300
#define CL_USE_DEPRECATED_OPENCL_1_0_APIS
#define CL_USE_DEPRECATED_OPENCL_1_1_APIS
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#define CL_USE_DEPRECATED_OPENCL_2_0_APIS
#include <CL/cl.h>
#include <CL/cl_icd.h>

#include "remote.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#define ACCELPOOL_EXPORT extern "C" __attribute__((visibility("default")))

using accelpool::clicd::Granted;
using accelpool::clicd::kLinkLost;
using accelpool::clicd::Link;
using accelpool::clicd::Pool;
namespace clwire = accelpool::clwire;
using clwire::Info;
using clwire::Object;
using clwire::Op;

namespace {
cl_icd_dispatch dispatch_table;
// The program's live buffers: a kernel argument that holds one of them is a buffer, anything else a value.
std::mutex live_mu;
std::map<const void*, std::uint64_t> live_mems;
}  // namespace

// Every object starts with the dispatch table, as the ICD loader requires.
struct _cl_platform_id {
  const cl_icd_dispatch* dispatch = &dispatch_table;
};

struct _cl_device_id {
  const cl_icd_dispatch* dispatch = &dispatch_table;
};

namespace {

_cl_platform_id the_platform;
_cl_device_id the_device;  // the granted device, whichever lease holds it now

// What every other object has: its id on the link it was made on, and the program's references to it.
struct Remote {
  const cl_icd_dispatch* dispatch = &dispatch_table;
  std::shared_ptr<Link> link;
  std::uint64_t id = 0;
  std::atomic<cl_uint> refs{1};
};

}  // namespace

struct _cl_context : Remote {};
struct _cl_command_queue : Remote {
  cl_context context = nullptr;
  cl_command_queue_properties properties = 0;
};
struct _cl_mem : Remote {
  cl_context context = nullptr;
  cl_mem_flags flags = 0;
  std::size_t size = 0;
  void* host_ptr = nullptr;  // CL_MEM_USE_HOST_PTR's memory
  std::atomic<cl_uint> maps{0};
  ~_cl_mem() {
    std::lock_guard lock(live_mu);
    live_mems.erase(this);
  }
};
struct _cl_program : Remote {
  cl_context context = nullptr;
  std::string source;
};
struct _cl_kernel : Remote {
  cl_context context = nullptr;
  cl_program program = nullptr;
};
struct _cl_event : Remote {
  cl_context context = nullptr;
  cl_command_queue queue = nullptr;
  cl_command_type type = 0;
};

namespace {

// --- answering info queries ---------------------------------------------------------------------------------

cl_int give(const void* data, std::size_t n, std::size_t size, void* value, std::size_t* size_ret) {
  if (value != nullptr) {
    if (size < n) return CL_INVALID_VALUE;
    std::memcpy(value, data, n);
  }
  if (size_ret != nullptr) *size_ret = n;
  return CL_SUCCESS;
}
template <typename T>
cl_int give_value(const T& v, std::size_t size, void* value, std::size_t* size_ret) {
  return give(&v, sizeof v, size, value, size_ret);
}
cl_int give_string(const std::string& s, std::size_t size, void* value, std::size_t* size_ret) {
  return give(s.c_str(), s.size() + 1, size, value, size_ret);
}

// Asks the device's host; the value it sends is given as the program asked.
cl_int forward_info(Link& link, Info what, std::uint64_t id, cl_uint param, std::uint64_t extra, std::size_t size,
                    void* value, std::size_t* size_ret, std::string* raw = nullptr) {
  clwire::Writer w(Op::get_info, clwire::kWantsReply);
  w.u8(static_cast<std::uint8_t>(what)).u64(id).u32(param).u64(extra);
  std::string reply;
  cl_int status = link.call(w, reply);
  if (status != CL_SUCCESS) return status;
  clwire::Reader r(reply);
  std::string_view bytes = r.bytes();
  if (raw != nullptr) *raw = std::string(bytes);
  return give(bytes.data(), bytes.size(), size, value, size_ret);
}

void set_error(cl_int* errcode_ret, cl_int code) {
  if (errcode_ret != nullptr) *errcode_ret = code;
}

// A new object of `link`, or nullptr with the status a call returned.
template <typename T>
T* made(std::shared_ptr<Link> link, std::uint64_t id, cl_int status, cl_int* errcode_ret) {
  if (errcode_ret != nullptr) *errcode_ret = status;
  if (status != CL_SUCCESS) return nullptr;
  T* o = new T;
  o->link = std::move(link);
  o->id = id;
  return o;
}

// Sends a request that needs a reply on `link`; returns its status (and the reply's fields in `reply`).
// `tail`: the data of the request's last field, sent from where it is (Link::post).
cl_int ask(Link& link, clwire::Writer& w, std::string* reply = nullptr, const std::string_view* tail = nullptr) {
  std::string ignored;
  return link.call(w, reply != nullptr ? *reply : ignored, tail);
}
// Sends a request without a reply; CL_DEVICE_NOT_AVAILABLE when the link is lost.
cl_int tell(Link& link, clwire::Writer& w, const std::string_view* tail = nullptr) {
  return link.post(w, tail) ? CL_SUCCESS : kLinkLost;
}

void release_remote(Remote* o, Object type) {
  clwire::Writer w(Op::release);
  w.u8(static_cast<std::uint8_t>(type)).u64(o->id);
  (void)o->link->post(w);
}

template <typename T>
cl_int retain(T* o) {
  if (o == nullptr) return CL_INVALID_VALUE;
  ++o->refs;
  return CL_SUCCESS;
}

// Drops one of the program's references to `o` (`invalid` when it is null). At the last one the host releases its
// object, and `o`'s reference to the object it was made from (`o->*parent`) goes through `release_parent`.
template <typename T, typename Parent>
cl_int drop(T* o, cl_int invalid, Object type, Parent T::*parent, cl_int(CL_API_CALL* release_parent)(Parent)) {
  if (o == nullptr) return invalid;
  if (--o->refs == 0) {
    release_remote(o, type);
    Parent up = o->*parent;
    delete o;
    release_parent(up);
  }
  return CL_SUCCESS;
}

// --- platform and device ----------------------------------------------------------------------------------------

std::shared_ptr<Granted> granted(cl_int& status) {
  std::string error;
  auto g = Pool::instance().device(error);
  status = g ? CL_SUCCESS : CL_DEVICE_NOT_FOUND;
  return g;
}

cl_int CL_API_CALL get_platform_ids(cl_uint num_entries, cl_platform_id* platforms, cl_uint* num_platforms) {
  if ((platforms == nullptr && num_platforms == nullptr) || (platforms != nullptr && num_entries == 0))
    return CL_INVALID_VALUE;
  if (platforms != nullptr) platforms[0] = &the_platform;
  if (num_platforms != nullptr) *num_platforms = 1;
  return CL_SUCCESS;
}

cl_int CL_API_CALL get_platform_info(cl_platform_id platform, cl_platform_info param, std::size_t size, void* value,
                                     std::size_t* size_ret) {
  if (platform != nullptr && platform != &the_platform) return CL_INVALID_PLATFORM;
  switch (param) {
    case CL_PLATFORM_PROFILE:
      return give_string("FULL_PROFILE", size, value, size_ret);
    case CL_PLATFORM_VERSION:
      return give_string("OpenCL 1.2 accelpool", size, value, size_ret);
    case CL_PLATFORM_NAME:
      return give_string("accelpool", size, value, size_ret);
    case CL_PLATFORM_VENDOR:
      return give_string("accelpool", size, value, size_ret);
    case CL_PLATFORM_EXTENSIONS:
      return give_string("cl_khr_icd", size, value, size_ret);
    case CL_PLATFORM_ICD_SUFFIX_KHR:
      return give_string("accelpool", size, value, size_ret);
    default:
      return CL_INVALID_VALUE;
  }
}

cl_int CL_API_CALL get_device_ids(cl_platform_id platform, cl_device_type type, cl_uint num_entries,
                                  cl_device_id* devices, cl_uint* num_devices) {
  if (platform != nullptr && platform != &the_platform) return CL_INVALID_PLATFORM;
  if ((devices == nullptr && num_devices == nullptr) || (devices != nullptr && num_entries == 0))
    return CL_INVALID_VALUE;
  cl_int status = CL_SUCCESS;
  auto g = granted(status);
  if (!g) return status;
  cl_device_type has = 0;
  status = forward_info(*g->link, Info::device, 0, CL_DEVICE_TYPE, 0, sizeof has, &has, nullptr);
  if (status != CL_SUCCESS) return status;
  if (type != CL_DEVICE_TYPE_ALL && type != CL_DEVICE_TYPE_DEFAULT && (type & has) == 0) return CL_DEVICE_NOT_FOUND;
  if (devices != nullptr) devices[0] = &the_device;
  if (num_devices != nullptr) *num_devices = 1;
  return CL_SUCCESS;
}

// "OpenCL 3.0 PoCL ..." as this platform offers it: "OpenCL 1.2 accelpool (PoCL ...)".
std::string capped_version(const std::string& remote) {
  std::string rest = remote;
  for (int words = 0; words < 2; ++words) {
    const auto space = rest.find(' ');
    rest = space == std::string::npos ? std::string() : rest.substr(space + 1);
  }
  while (!rest.empty() && rest.back() == '\0') rest.pop_back();
  return "OpenCL 1.2 accelpool (" + rest + ")";
}

cl_int CL_API_CALL get_device_info(cl_device_id device, cl_device_info param, std::size_t size, void* value,
                                   std::size_t* size_ret) {
  if (device != &the_device) return CL_INVALID_DEVICE;
  cl_int status = CL_SUCCESS;
  auto g = granted(status);
  if (!g) return status;
  switch (param) {
    case CL_DEVICE_PLATFORM:
      return give_value(static_cast<cl_platform_id>(&the_platform), size, value, size_ret);
    case CL_DEVICE_VERSION: {
      std::string remote;
      status = forward_info(*g->link, Info::device, 0, param, 0, 0, nullptr, nullptr, &remote);
      return status != CL_SUCCESS ? status : give_string(capped_version(remote), size, value, size_ret);
    }
    case CL_DEVICE_IMAGE_SUPPORT:
    case CL_DEVICE_HOST_UNIFIED_MEMORY:
      return give_value(static_cast<cl_bool>(CL_FALSE), size, value, size_ret);
    case CL_DEVICE_PARENT_DEVICE:
      return give_value(static_cast<cl_device_id>(nullptr), size, value, size_ret);
    case CL_DEVICE_PARTITION_MAX_SUB_DEVICES:
      return give_value(static_cast<cl_uint>(0), size, value, size_ret);
    case CL_DEVICE_PARTITION_PROPERTIES:
      return give_value(static_cast<cl_device_partition_property>(0), size, value, size_ret);
    case CL_DEVICE_PARTITION_TYPE:
      return give(nullptr, 0, size, value, size_ret);
    case CL_DEVICE_REFERENCE_COUNT:
      return give_value(static_cast<cl_uint>(1), size, value, size_ret);
    case CL_DEVICE_SVM_CAPABILITIES:
      return give_value(static_cast<cl_device_svm_capabilities>(0), size, value, size_ret);
    default:
      return forward_info(*g->link, Info::device, 0, param, 0, size, value, size_ret);
  }
}

cl_int CL_API_CALL retain_device(cl_device_id device) { return device == &the_device ? CL_SUCCESS : CL_INVALID_DEVICE; }

// --- contexts ---------------------------------------------------------------------------------------------------

cl_context new_context(cl_int* errcode_ret) {
  cl_int status = CL_SUCCESS;
  auto g = granted(status);
  if (!g) {
    set_error(errcode_ret, status);
    return nullptr;
  }
  const auto id = g->link->next_id();
  clwire::Writer w(Op::create_context, clwire::kWantsReply);
  w.u64(id);
  auto* c = made<_cl_context>(g->link, id, ask(*g->link, w), errcode_ret);
  if (c != nullptr) Pool::instance().context_created();
  return c;
}

cl_context CL_API_CALL create_context(const cl_context_properties* properties, cl_uint num_devices,
                                      const cl_device_id* devices,
                                      void(CL_CALLBACK*)(const char*, const void*, std::size_t, void*), void*,
                                      cl_int* errcode_ret) {
  (void)properties;
  if (num_devices == 0 || devices == nullptr) {
    set_error(errcode_ret, CL_INVALID_VALUE);
    return nullptr;
  }
  for (cl_uint i = 0; i < num_devices; ++i) {
    if (devices[i] != &the_device) {
      set_error(errcode_ret, CL_INVALID_DEVICE);
      return nullptr;
    }
  }
  return new_context(errcode_ret);
}

cl_context CL_API_CALL create_context_from_type(const cl_context_properties*, cl_device_type type,
                                                void(CL_CALLBACK*)(const char*, const void*, std::size_t, void*), void*,
                                                cl_int* errcode_ret) {
  cl_uint n = 0;
  cl_int status = get_device_ids(nullptr, type, 0, nullptr, &n);
  if (status != CL_SUCCESS) {
    set_error(errcode_ret, status);
    return nullptr;
  }
  return new_context(errcode_ret);
}

cl_int CL_API_CALL retain_context(cl_context c) { return c == nullptr ? CL_INVALID_CONTEXT : retain(c); }

cl_int CL_API_CALL release_context(cl_context c) {
  if (c == nullptr) return CL_INVALID_CONTEXT;
  if (--c->refs == 0) {
    release_remote(c, Object::context);
    delete c;
    Pool::instance().context_released();
  }
  return CL_SUCCESS;
}

cl_int CL_API_CALL get_context_info(cl_context c, cl_context_info param, std::size_t size, void* value,
                                    std::size_t* size_ret) {
  if (c == nullptr) return CL_INVALID_CONTEXT;
  switch (param) {
    case CL_CONTEXT_REFERENCE_COUNT:
      return give_value(c->refs.load(), size, value, size_ret);
    case CL_CONTEXT_NUM_DEVICES:
      return give_value(static_cast<cl_uint>(1), size, value, size_ret);
    case CL_CONTEXT_DEVICES:
      return give_value(static_cast<cl_device_id>(&the_device), size, value, size_ret);
    case CL_CONTEXT_PROPERTIES:
      return give(nullptr, 0, size, value, size_ret);
    default:
      return forward_info(*c->link, Info::context, c->id, param, 0, size, value, size_ret);
  }
}

// --- command queues ---------------------------------------------------------------------------------------------

cl_command_queue new_queue(cl_context c, cl_device_id device, cl_command_queue_properties props, cl_int* errcode_ret) {
  if (c == nullptr || device != &the_device) {
    set_error(errcode_ret, c == nullptr ? CL_INVALID_CONTEXT : CL_INVALID_DEVICE);
    return nullptr;
  }
  const auto id = c->link->next_id();
  clwire::Writer w(Op::create_queue, clwire::kWantsReply);
  w.u64(id).u64(c->id).u64(props);
  auto* q = made<_cl_command_queue>(c->link, id, ask(*c->link, w), errcode_ret);
  if (q != nullptr) {
    q->context = c;
    q->properties = props;
    retain(c);
  }
  return q;
}

cl_command_queue CL_API_CALL create_queue(cl_context c, cl_device_id device, cl_command_queue_properties props,
                                          cl_int* errcode_ret) {
  return new_queue(c, device, props, errcode_ret);
}

cl_command_queue CL_API_CALL create_queue_with_properties(cl_context c, cl_device_id device,
                                                          const cl_queue_properties* properties, cl_int* errcode_ret) {
  cl_command_queue_properties props = 0;
  for (const cl_queue_properties* p = properties; p != nullptr && p[0] != 0; p += 2) {
    if (p[0] != CL_QUEUE_PROPERTIES) {
      set_error(errcode_ret, CL_INVALID_QUEUE_PROPERTIES);
      return nullptr;
    }
    props = static_cast<cl_command_queue_properties>(p[1]);
  }
  return new_queue(c, device, props, errcode_ret);
}

cl_int CL_API_CALL retain_queue(cl_command_queue q) { return q == nullptr ? CL_INVALID_COMMAND_QUEUE : retain(q); }

cl_int CL_API_CALL release_queue(cl_command_queue q) {
  return drop(q, CL_INVALID_COMMAND_QUEUE, Object::queue, &_cl_command_queue::context, release_context);
}

cl_int CL_API_CALL get_queue_info(cl_command_queue q, cl_command_queue_info param, std::size_t size, void* value,
                                  std::size_t* size_ret) {
  if (q == nullptr) return CL_INVALID_COMMAND_QUEUE;
  switch (param) {
    case CL_QUEUE_CONTEXT:
      return give_value(q->context, size, value, size_ret);
    case CL_QUEUE_DEVICE:
      return give_value(static_cast<cl_device_id>(&the_device), size, value, size_ret);
    case CL_QUEUE_REFERENCE_COUNT:
      return give_value(q->refs.load(), size, value, size_ret);
    case CL_QUEUE_PROPERTIES:
      return give_value(q->properties, size, value, size_ret);
    default:
      return forward_info(*q->link, Info::queue, q->id, param, 0, size, value, size_ret);
  }
}

cl_int CL_API_CALL flush(cl_command_queue q) {
  if (q == nullptr) return CL_INVALID_COMMAND_QUEUE;
  clwire::Writer w(Op::flush);
  w.u64(q->id);
  return tell(*q->link, w) == CL_SUCCESS && q->link->flush() ? CL_SUCCESS : kLinkLost;
}

cl_int CL_API_CALL finish(cl_command_queue q) {
  if (q == nullptr) return CL_INVALID_COMMAND_QUEUE;
  clwire::Writer w(Op::finish, clwire::kWantsReply);
  w.u64(q->id);
  return ask(*q->link, w);
}

// --- events -----------------------------------------------------------------------------------------------------

// The ids of a wait list, or false when an event is missing or of another link.
bool wait_ids(const Link& link, cl_uint n, const cl_event* events, std::vector<std::uint64_t>& ids) {
  if ((n == 0) != (events == nullptr)) return false;
  for (cl_uint i = 0; i < n; ++i) {
    if (events[i] == nullptr || events[i]->link.get() != &link) return false;
    ids.push_back(events[i]->id);
  }
  return true;
}

// An enqueue: `w` gets the wait list and the id of the event the program asked for; the request is sent with a
// reply when `wait`, else batched. The new event goes to `*event` when the request was accepted.
// How an enqueue's request travels: batched (the default), or waiting for its reply; with bulk data as its last
// field (`tail`, sent from the program's memory), or with its reply's data read straight into `into`.
struct Send {
  bool wait = false;
  const std::string_view* tail = nullptr;
  void* into = nullptr;
  std::size_t into_size = 0;
};

cl_int enqueue(cl_command_queue q, clwire::Writer& w, cl_uint num_waits, const cl_event* waits, cl_event* event,
               cl_command_type type, Send send = {}) {
  std::vector<std::uint64_t> ids;
  if (!wait_ids(*q->link, num_waits, waits, ids)) return CL_INVALID_EVENT_WAIT_LIST;
  const std::uint64_t event_id = event != nullptr ? q->link->next_id() : 0;
  w.ids(ids).u64(event_id);
  if (send.tail != nullptr) w.u64(send.tail->size());
  cl_int status = send.into != nullptr ? q->link->call_into(w, send.into, send.into_size)
                  : send.wait          ? ask(*q->link, w, nullptr, send.tail)
                                       : tell(*q->link, w, send.tail);
  if (status == CL_SUCCESS && event != nullptr) {
    auto* e = made<_cl_event>(q->link, event_id, CL_SUCCESS, nullptr);
    e->context = q->context;
    e->queue = q;
    e->type = type;
    retain(q);
    *event = e;
  }
  return status;
}

cl_int CL_API_CALL wait_for_events(cl_uint n, const cl_event* events) {
  if (n == 0 || events == nullptr || events[0] == nullptr) return CL_INVALID_VALUE;
  std::vector<std::uint64_t> ids;
  Link& link = *events[0]->link;
  if (!wait_ids(link, n, events, ids)) return CL_INVALID_EVENT;
  clwire::Writer w(Op::wait_events, clwire::kWantsReply);
  w.ids(ids);
  return ask(link, w);
}

cl_int CL_API_CALL retain_event(cl_event e) { return e == nullptr ? CL_INVALID_EVENT : retain(e); }

cl_int CL_API_CALL release_event(cl_event e) {
  return drop(e, CL_INVALID_EVENT, Object::event, &_cl_event::queue, release_queue);
}

cl_int CL_API_CALL get_event_info(cl_event e, cl_event_info param, std::size_t size, void* value,
                                  std::size_t* size_ret) {
  if (e == nullptr) return CL_INVALID_EVENT;
  switch (param) {
    case CL_EVENT_COMMAND_QUEUE:
      return give_value(e->queue, size, value, size_ret);
    case CL_EVENT_CONTEXT:
      return give_value(e->context, size, value, size_ret);
    case CL_EVENT_COMMAND_TYPE:
      return give_value(e->type, size, value, size_ret);
    case CL_EVENT_REFERENCE_COUNT:
      return give_value(e->refs.load(), size, value, size_ret);
    default:
      return forward_info(*e->link, Info::event, e->id, param, 0, size, value, size_ret);
  }
}

cl_int CL_API_CALL get_event_profiling_info(cl_event e, cl_profiling_info param, std::size_t size, void* value,
                                            std::size_t* size_ret) {
  if (e == nullptr) return CL_INVALID_EVENT;
  return forward_info(*e->link, Info::event_profiling, e->id, param, 0, size, value, size_ret);
}

// --- buffers ----------------------------------------------------------------------------------------------------

cl_mem CL_API_CALL create_buffer(cl_context c, cl_mem_flags flags, std::size_t size, void* host_ptr,
                                 cl_int* errcode_ret) {
  if (c == nullptr) {
    set_error(errcode_ret, CL_INVALID_CONTEXT);
    return nullptr;
  }
  const bool uses_host = (flags & (CL_MEM_USE_HOST_PTR | CL_MEM_COPY_HOST_PTR)) != 0;
  if (size == 0 || uses_host != (host_ptr != nullptr) ||
      ((flags & CL_MEM_USE_HOST_PTR) && (flags & (CL_MEM_COPY_HOST_PTR | CL_MEM_ALLOC_HOST_PTR)))) {
    set_error(errcode_ret, size == 0 ? CL_INVALID_BUFFER_SIZE : uses_host ? CL_INVALID_HOST_PTR : CL_INVALID_VALUE);
    return nullptr;
  }
  const auto id = c->link->next_id();
  clwire::Writer w(Op::create_buffer, clwire::kWantsReply);
  const std::string_view initial(static_cast<const char*>(host_ptr), uses_host ? size : 0);
  w.u64(id).u64(c->id).u64(flags).u64(size).u64(initial.size());  // the initial data follows as the tail
  auto* m = made<_cl_mem>(c->link, id, ask(*c->link, w, nullptr, &initial), errcode_ret);
  if (m != nullptr) {
    m->context = c;
    m->flags = flags;
    m->size = size;
    m->host_ptr = (flags & CL_MEM_USE_HOST_PTR) ? host_ptr : nullptr;
    retain(c);
    std::lock_guard lock(live_mu);
    live_mems[m] = id;
  }
  return m;
}

cl_int CL_API_CALL retain_mem(cl_mem m) { return m == nullptr ? CL_INVALID_MEM_OBJECT : retain(m); }

cl_int CL_API_CALL release_mem(cl_mem m) {
  return drop(m, CL_INVALID_MEM_OBJECT, Object::mem, &_cl_mem::context, release_context);
}

cl_int CL_API_CALL get_mem_info(cl_mem m, cl_mem_info param, std::size_t size, void* value, std::size_t* size_ret) {
  if (m == nullptr) return CL_INVALID_MEM_OBJECT;
  switch (param) {
    case CL_MEM_TYPE:
      return give_value(static_cast<cl_mem_object_type>(CL_MEM_OBJECT_BUFFER), size, value, size_ret);
    case CL_MEM_FLAGS:
      return give_value(m->flags, size, value, size_ret);
    case CL_MEM_SIZE:
      return give_value(m->size, size, value, size_ret);
    case CL_MEM_HOST_PTR:
      return give_value(m->host_ptr, size, value, size_ret);
    case CL_MEM_MAP_COUNT:
      return give_value(m->maps.load(), size, value, size_ret);
    case CL_MEM_REFERENCE_COUNT:
      return give_value(m->refs.load(), size, value, size_ret);
    case CL_MEM_CONTEXT:
      return give_value(m->context, size, value, size_ret);
    case CL_MEM_ASSOCIATED_MEMOBJECT:
      return give_value(static_cast<cl_mem>(nullptr), size, value, size_ret);
    case CL_MEM_OFFSET:
      return give_value(static_cast<std::size_t>(0), size, value, size_ret);
    default:
      return forward_info(*m->link, Info::mem, m->id, param, 0, size, value, size_ret);
  }
}

cl_int CL_API_CALL get_image_formats(cl_context c, cl_mem_flags, cl_mem_object_type, cl_uint, cl_image_format*,
                                     cl_uint* num) {
  if (c == nullptr) return CL_INVALID_CONTEXT;
  if (num != nullptr) *num = 0;
  return CL_SUCCESS;
}

bool same_link(cl_command_queue q, cl_mem m) { return q != nullptr && m != nullptr && q->link == m->link; }

// Reads `size` bytes at `offset` of `m` into `ptr` (always waits: the data must be there when the call returns).
cl_int read_into(cl_command_queue q, cl_mem m, std::size_t offset, std::size_t size, void* ptr, cl_uint num_waits,
                 const cl_event* waits, cl_event* event, cl_command_type type) {
  if (q == nullptr) return CL_INVALID_COMMAND_QUEUE;
  if (!same_link(q, m)) return CL_INVALID_MEM_OBJECT;
  if (ptr == nullptr || offset + size > m->size) return CL_INVALID_VALUE;
  clwire::Writer w(Op::read_buffer, clwire::kWantsReply);
  w.u64(q->id).u64(m->id).u64(offset).u64(size);
  return enqueue(q, w, num_waits, waits, event, type, {.wait = true, .into = ptr, .into_size = size});
}

cl_int write_from(cl_command_queue q, cl_mem m, bool blocking, std::size_t offset, std::size_t size, const void* ptr,
                  cl_uint num_waits, const cl_event* waits, cl_event* event, cl_command_type type) {
  if (q == nullptr) return CL_INVALID_COMMAND_QUEUE;
  if (!same_link(q, m)) return CL_INVALID_MEM_OBJECT;
  if (ptr == nullptr || offset + size > m->size) return CL_INVALID_VALUE;
  clwire::Writer w(Op::write_buffer, blocking ? clwire::kWantsReply : 0);
  w.u64(q->id).u64(m->id).u64(offset);
  const std::string_view data(static_cast<const char*>(ptr), size);
  return enqueue(q, w, num_waits, waits, event, type, {.wait = blocking, .tail = &data});
}

cl_int CL_API_CALL enqueue_read_buffer(cl_command_queue q, cl_mem m, cl_bool, std::size_t offset, std::size_t size,
                                       void* ptr, cl_uint num_waits, const cl_event* waits, cl_event* event) {
  return read_into(q, m, offset, size, ptr, num_waits, waits, event, CL_COMMAND_READ_BUFFER);
}

cl_int CL_API_CALL enqueue_write_buffer(cl_command_queue q, cl_mem m, cl_bool blocking, std::size_t offset,
                                        std::size_t size, const void* ptr, cl_uint num_waits, const cl_event* waits,
                                        cl_event* event) {
  return write_from(q, m, blocking == CL_TRUE, offset, size, ptr, num_waits, waits, event, CL_COMMAND_WRITE_BUFFER);
}

cl_int CL_API_CALL enqueue_copy_buffer(cl_command_queue q, cl_mem src, cl_mem dst, std::size_t src_offset,
                                       std::size_t dst_offset, std::size_t size, cl_uint num_waits,
                                       const cl_event* waits, cl_event* event) {
  if (q == nullptr) return CL_INVALID_COMMAND_QUEUE;
  if (!same_link(q, src) || !same_link(q, dst)) return CL_INVALID_MEM_OBJECT;
  if (src_offset + size > src->size || dst_offset + size > dst->size) return CL_INVALID_VALUE;
  clwire::Writer w(Op::copy_buffer);
  w.u64(q->id).u64(src->id).u64(dst->id).u64(src_offset).u64(dst_offset).u64(size);
  return enqueue(q, w, num_waits, waits, event, CL_COMMAND_COPY_BUFFER);
}

cl_int CL_API_CALL enqueue_fill_buffer(cl_command_queue q, cl_mem m, const void* pattern, std::size_t pattern_size,
                                       std::size_t offset, std::size_t size, cl_uint num_waits, const cl_event* waits,
                                       cl_event* event) {
  if (q == nullptr) return CL_INVALID_COMMAND_QUEUE;
  if (!same_link(q, m)) return CL_INVALID_MEM_OBJECT;
  if (pattern == nullptr || pattern_size == 0 || offset + size > m->size) return CL_INVALID_VALUE;
  clwire::Writer w(Op::fill_buffer);
  w.u64(q->id).u64(m->id).bytes(pattern, pattern_size).u64(offset).u64(size);
  return enqueue(q, w, num_waits, waits, event, CL_COMMAND_FILL_BUFFER);
}

// A mapped region: the program works in host memory of ours, written back at unmap when mapped for writing.
struct Mapping {
  cl_mem mem;
  std::size_t offset, size;
  bool write;
  bool owned;  // our allocation (not the buffer's CL_MEM_USE_HOST_PTR memory)
};
std::mutex mappings_mu;
std::map<void*, Mapping> mappings;

void* CL_API_CALL enqueue_map_buffer(cl_command_queue q, cl_mem m, cl_bool, cl_map_flags flags, std::size_t offset,
                                     std::size_t size, cl_uint num_waits, const cl_event* waits, cl_event* event,
                                     cl_int* errcode_ret) {
  if (q == nullptr || !same_link(q, m) || size == 0 || offset + size > m->size) {
    set_error(errcode_ret, q == nullptr       ? CL_INVALID_COMMAND_QUEUE
                           : !same_link(q, m) ? CL_INVALID_MEM_OBJECT
                                              : CL_INVALID_VALUE);
    return nullptr;
  }
  const bool owned = m->host_ptr == nullptr;
  void* ptr = owned ? std::malloc(size) : static_cast<char*>(m->host_ptr) + offset;
  if (ptr == nullptr) {
    set_error(errcode_ret, CL_OUT_OF_HOST_MEMORY);
    return nullptr;
  }
  cl_int status = CL_SUCCESS;
  if (flags & CL_MAP_WRITE_INVALIDATE_REGION) {
    clwire::Writer w(Op::marker);
    w.u64(q->id);
    status = enqueue(q, w, num_waits, waits, event, CL_COMMAND_MAP_BUFFER);
  } else {
    status = read_into(q, m, offset, size, ptr, num_waits, waits, event, CL_COMMAND_MAP_BUFFER);
  }
  set_error(errcode_ret, status);
  if (status != CL_SUCCESS) {
    if (owned) std::free(ptr);
    return nullptr;
  }
  ++m->maps;
  std::lock_guard lock(mappings_mu);
  mappings[ptr] = {m, offset, size, (flags & (CL_MAP_WRITE | CL_MAP_WRITE_INVALIDATE_REGION)) != 0, owned};
  return ptr;
}

cl_int CL_API_CALL enqueue_unmap(cl_command_queue q, cl_mem m, void* ptr, cl_uint num_waits, const cl_event* waits,
                                 cl_event* event) {
  if (q == nullptr) return CL_INVALID_COMMAND_QUEUE;
  if (!same_link(q, m)) return CL_INVALID_MEM_OBJECT;
  Mapping map{};
  {
    std::lock_guard lock(mappings_mu);
    auto it = mappings.find(ptr);
    if (it == mappings.end() || it->second.mem != m) return CL_INVALID_VALUE;
    map = it->second;
    mappings.erase(it);
  }
  --m->maps;
  cl_int status = CL_SUCCESS;
  if (map.write) {
    status = write_from(q, m, false, map.offset, map.size, ptr, num_waits, waits, event, CL_COMMAND_UNMAP_MEM_OBJECT);
  } else {
    clwire::Writer w(Op::marker);
    w.u64(q->id);
    status = enqueue(q, w, num_waits, waits, event, CL_COMMAND_UNMAP_MEM_OBJECT);
  }
  if (map.owned) std::free(ptr);
  return status;
}

// --- programs and kernels ---------------------------------------------------------------------------------------

cl_program CL_API_CALL create_program_with_source(cl_context c, cl_uint count, const char** strings,
                                                  const std::size_t* lengths, cl_int* errcode_ret) {
  if (c == nullptr || count == 0 || strings == nullptr) {
    set_error(errcode_ret, c == nullptr ? CL_INVALID_CONTEXT : CL_INVALID_VALUE);
    return nullptr;
  }
  std::string source;
  for (cl_uint i = 0; i < count; ++i) {
    if (strings[i] == nullptr) {
      set_error(errcode_ret, CL_INVALID_VALUE);
      return nullptr;
    }
    source.append(strings[i], lengths != nullptr && lengths[i] != 0 ? lengths[i] : std::strlen(strings[i]));
  }
  const auto id = c->link->next_id();
  clwire::Writer w(Op::create_program_source, clwire::kWantsReply);
  w.u64(id).u64(c->id).str(source);
  auto* p = made<_cl_program>(c->link, id, ask(*c->link, w), errcode_ret);
  if (p != nullptr) {
    p->context = c;
    p->source = std::move(source);
    retain(c);
  }
  return p;
}

cl_program CL_API_CALL create_program_with_binary(cl_context c, cl_uint num_devices, const cl_device_id* devices,
                                                  const std::size_t* lengths, const unsigned char** binaries,
                                                  cl_int* binary_status, cl_int* errcode_ret) {
  if (c == nullptr || num_devices != 1 || devices == nullptr || devices[0] != &the_device || lengths == nullptr ||
      binaries == nullptr || binaries[0] == nullptr || lengths[0] == 0) {
    set_error(errcode_ret, c == nullptr ? CL_INVALID_CONTEXT : CL_INVALID_VALUE);
    return nullptr;
  }
  const auto id = c->link->next_id();
  clwire::Writer w(Op::create_program_binary, clwire::kWantsReply);
  w.u64(id).u64(c->id).bytes(binaries[0], lengths[0]);
  std::string reply;
  cl_int status = ask(*c->link, w, &reply);
  clwire::Reader r(reply);
  const cl_int one = status == kLinkLost ? CL_INVALID_BINARY : r.i32();
  if (binary_status != nullptr) binary_status[0] = one;
  auto* p = made<_cl_program>(c->link, id, status, errcode_ret);
  if (p != nullptr) {
    p->context = c;
    retain(c);
  }
  return p;
}

cl_int CL_API_CALL retain_program(cl_program p) { return p == nullptr ? CL_INVALID_PROGRAM : retain(p); }

cl_int CL_API_CALL release_program(cl_program p) {
  return drop(p, CL_INVALID_PROGRAM, Object::program, &_cl_program::context, release_context);
}

cl_int CL_API_CALL build_program(cl_program p, cl_uint num_devices, const cl_device_id* devices, const char* options,
                                 void(CL_CALLBACK* notify)(cl_program, void*), void* user_data) {
  if (p == nullptr) return CL_INVALID_PROGRAM;
  if ((num_devices == 0) != (devices == nullptr)) return CL_INVALID_VALUE;
  for (cl_uint i = 0; i < num_devices; ++i) {
    if (devices[i] != &the_device) return CL_INVALID_DEVICE;
  }
  clwire::Writer w(Op::build_program, clwire::kWantsReply);
  w.u64(p->id).str(options != nullptr ? options : "");
  cl_int status = ask(*p->link, w);
  if (notify != nullptr) notify(p, user_data);  // the build is complete when the call returns
  return status;
}

cl_int CL_API_CALL get_program_info(cl_program p, cl_program_info param, std::size_t size, void* value,
                                    std::size_t* size_ret) {
  if (p == nullptr) return CL_INVALID_PROGRAM;
  switch (param) {
    case CL_PROGRAM_REFERENCE_COUNT:
      return give_value(p->refs.load(), size, value, size_ret);
    case CL_PROGRAM_CONTEXT:
      return give_value(p->context, size, value, size_ret);
    case CL_PROGRAM_NUM_DEVICES:
      return give_value(static_cast<cl_uint>(1), size, value, size_ret);
    case CL_PROGRAM_DEVICES:
      return give_value(static_cast<cl_device_id>(&the_device), size, value, size_ret);
    case CL_PROGRAM_SOURCE:
      return give_string(p->source, size, value, size_ret);
    case CL_PROGRAM_BINARIES: {
      if (value == nullptr) return give(nullptr, sizeof(unsigned char*), size, value, size_ret);
      if (size < sizeof(unsigned char*)) return CL_INVALID_VALUE;
      clwire::Writer w(Op::program_binary, clwire::kWantsReply);
      w.u64(p->id);
      std::string reply;
      cl_int status = ask(*p->link, w, &reply);
      if (status != CL_SUCCESS) return status;
      clwire::Reader r(reply);
      std::string_view binary = r.bytes();
      unsigned char* out = static_cast<unsigned char**>(value)[0];
      if (out != nullptr) std::memcpy(out, binary.data(), binary.size());
      if (size_ret != nullptr) *size_ret = sizeof(unsigned char*);
      return CL_SUCCESS;
    }
    default:
      return forward_info(*p->link, Info::program, p->id, param, 0, size, value, size_ret);
  }
}

cl_int CL_API_CALL get_program_build_info(cl_program p, cl_device_id device, cl_program_build_info param,
                                          std::size_t size, void* value, std::size_t* size_ret) {
  if (p == nullptr) return CL_INVALID_PROGRAM;
  if (device != &the_device) return CL_INVALID_DEVICE;
  return forward_info(*p->link, Info::program_build, p->id, param, 0, size, value, size_ret);
}

cl_int CL_API_CALL unload_compiler() { return CL_SUCCESS; }
cl_int CL_API_CALL unload_platform_compiler(cl_platform_id) { return CL_SUCCESS; }

_cl_kernel* new_kernel(cl_program p, std::uint64_t id) {
  auto* k = made<_cl_kernel>(p->link, id, CL_SUCCESS, nullptr);
  k->context = p->context;
  k->program = p;
  retain(p);
  return k;
}

cl_kernel CL_API_CALL create_kernel(cl_program p, const char* name, cl_int* errcode_ret) {
  if (p == nullptr || name == nullptr) {
    set_error(errcode_ret, p == nullptr ? CL_INVALID_PROGRAM : CL_INVALID_VALUE);
    return nullptr;
  }
  const auto id = p->link->next_id();
  clwire::Writer w(Op::create_kernel, clwire::kWantsReply);
  w.u64(id).u64(p->id).str(name);
  cl_int status = ask(*p->link, w);
  set_error(errcode_ret, status);
  return status == CL_SUCCESS ? new_kernel(p, id) : nullptr;
}

cl_int CL_API_CALL create_kernels_in_program(cl_program p, cl_uint num_kernels, cl_kernel* kernels, cl_uint* num_ret) {
  if (p == nullptr) return CL_INVALID_PROGRAM;
  std::vector<std::uint64_t> ids;
  for (cl_uint i = 0; kernels != nullptr && i < num_kernels; ++i) ids.push_back(p->link->next_id());
  clwire::Writer w(Op::create_kernels, clwire::kWantsReply);
  w.u64(p->id).ids(ids);
  std::string reply;
  cl_int status = ask(*p->link, w, &reply);
  if (status != CL_SUCCESS) return status;
  clwire::Reader r(reply);
  const cl_uint n = r.u32();
  if (kernels != nullptr && num_kernels < n) return CL_INVALID_VALUE;
  for (cl_uint i = 0; kernels != nullptr && i < n; ++i) kernels[i] = new_kernel(p, ids[i]);
  if (num_ret != nullptr) *num_ret = n;
  return CL_SUCCESS;
}

cl_int CL_API_CALL retain_kernel(cl_kernel k) { return k == nullptr ? CL_INVALID_KERNEL : retain(k); }

cl_int CL_API_CALL release_kernel(cl_kernel k) {
  return drop(k, CL_INVALID_KERNEL, Object::kernel, &_cl_kernel::program, release_program);
}

cl_int CL_API_CALL set_kernel_arg(cl_kernel k, cl_uint index, std::size_t size, const void* value) {
  if (k == nullptr) return CL_INVALID_KERNEL;
  clwire::Writer w(Op::set_kernel_arg);
  w.u64(k->id).u32(index);
  if (value == nullptr) {
    if (size == 0) return CL_INVALID_ARG_SIZE;
    w.u8(static_cast<std::uint8_t>(clwire::ArgKind::local)).u64(size);
  } else {
    cl_mem m = nullptr;
    if (size == sizeof(cl_mem)) std::memcpy(&m, value, sizeof m);
    bool is_mem = false;
    if (m != nullptr) {
      std::lock_guard lock(live_mu);
      is_mem = live_mems.count(m) != 0;
    }
    if (is_mem && m->link == k->link) {
      w.u8(static_cast<std::uint8_t>(clwire::ArgKind::mem)).u64(m->id);
    } else {
      w.u8(static_cast<std::uint8_t>(clwire::ArgKind::value)).bytes(value, size);
    }
  }
  return tell(*k->link, w);
}

cl_int CL_API_CALL get_kernel_info(cl_kernel k, cl_kernel_info param, std::size_t size, void* value,
                                   std::size_t* size_ret) {
  if (k == nullptr) return CL_INVALID_KERNEL;
  switch (param) {
    case CL_KERNEL_REFERENCE_COUNT:
      return give_value(k->refs.load(), size, value, size_ret);
    case CL_KERNEL_CONTEXT:
      return give_value(k->context, size, value, size_ret);
    case CL_KERNEL_PROGRAM:
      return give_value(k->program, size, value, size_ret);
    default:
      return forward_info(*k->link, Info::kernel, k->id, param, 0, size, value, size_ret);
  }
}

cl_int CL_API_CALL get_kernel_work_group_info(cl_kernel k, cl_device_id device, cl_kernel_work_group_info param,
                                              std::size_t size, void* value, std::size_t* size_ret) {
  if (k == nullptr) return CL_INVALID_KERNEL;
  if (device != nullptr && device != &the_device) return CL_INVALID_DEVICE;
  return forward_info(*k->link, Info::kernel_work_group, k->id, param, 0, size, value, size_ret);
}

cl_int CL_API_CALL get_kernel_arg_info(cl_kernel k, cl_uint index, cl_kernel_arg_info param, std::size_t size,
                                       void* value, std::size_t* size_ret) {
  if (k == nullptr) return CL_INVALID_KERNEL;
  return forward_info(*k->link, Info::kernel_arg, k->id, param, index, size, value, size_ret);
}

cl_int CL_API_CALL enqueue_ndrange(cl_command_queue q, cl_kernel k, cl_uint dims, const std::size_t* offset,
                                   const std::size_t* global, const std::size_t* local, cl_uint num_waits,
                                   const cl_event* waits, cl_event* event) {
  if (q == nullptr) return CL_INVALID_COMMAND_QUEUE;
  if (k == nullptr || k->link != q->link) return CL_INVALID_KERNEL;
  if (dims < 1 || dims > 3) return CL_INVALID_WORK_DIMENSION;
  if (global == nullptr) return CL_INVALID_GLOBAL_WORK_SIZE;
  clwire::Writer w(Op::ndrange);
  w.u64(q->id).u64(k->id).u32(dims);
  for (cl_uint d = 0; d < dims; ++d) w.u64(offset != nullptr ? offset[d] : 0);
  for (cl_uint d = 0; d < dims; ++d) w.u64(global[d]);
  w.u8(local != nullptr ? 1 : 0);
  for (cl_uint d = 0; local != nullptr && d < dims; ++d) w.u64(local[d]);
  return enqueue(q, w, num_waits, waits, event, CL_COMMAND_NDRANGE_KERNEL);
}

cl_int CL_API_CALL enqueue_task(cl_command_queue q, cl_kernel k, cl_uint num_waits, const cl_event* waits,
                                cl_event* event) {
  const std::size_t one = 1;
  return enqueue_ndrange(q, k, 1, nullptr, &one, &one, num_waits, waits, event);
}

cl_int marker_or_barrier(Op op, cl_command_queue q, cl_uint num_waits, const cl_event* waits, cl_event* event) {
  if (q == nullptr) return CL_INVALID_COMMAND_QUEUE;
  clwire::Writer w(op);
  w.u64(q->id);
  return enqueue(q, w, num_waits, waits, event, op == Op::marker ? CL_COMMAND_MARKER : CL_COMMAND_BARRIER);
}

cl_int CL_API_CALL enqueue_marker_with_wait_list(cl_command_queue q, cl_uint n, const cl_event* waits,
                                                 cl_event* event) {
  return marker_or_barrier(Op::marker, q, n, waits, event);
}
cl_int CL_API_CALL enqueue_barrier_with_wait_list(cl_command_queue q, cl_uint n, const cl_event* waits,
                                                  cl_event* event) {
  return marker_or_barrier(Op::barrier, q, n, waits, event);
}
cl_int CL_API_CALL enqueue_marker(cl_command_queue q, cl_event* event) {
  return marker_or_barrier(Op::marker, q, 0, nullptr, event);
}
cl_int CL_API_CALL enqueue_barrier(cl_command_queue q) {
  return marker_or_barrier(Op::barrier, q, 0, nullptr, nullptr);
}
cl_int CL_API_CALL enqueue_wait_for_events(cl_command_queue q, cl_uint n, const cl_event* waits) {
  if (n == 0) return CL_INVALID_VALUE;
  return marker_or_barrier(Op::barrier, q, n, waits, nullptr);
}

// --- everything else: refused -----------------------------------------------------------------------------------

// An entry this platform does not offer: CL_INVALID_OPERATION, through the error out-parameter for calls that
// return an object.
template <typename F>
struct Refuse;
template <typename R, typename... A>
struct Refuse<R(CL_API_CALL*)(A...)> {
  static R CL_API_CALL call(A... args) {
    if constexpr (std::is_same_v<R, cl_int>) {
      ((void)args, ...);
      return CL_INVALID_OPERATION;
    } else {
      if constexpr (sizeof...(A) > 0) {
        auto last = std::get<sizeof...(A) - 1>(std::tuple<A...>(args...));
        if constexpr (std::is_same_v<decltype(last), cl_int*>) {
          if (last != nullptr) *last = CL_INVALID_OPERATION;
        }
      }
      return R{};
    }
  }
};
template <typename F>
void refuse(F& entry) {
  if constexpr (std::is_pointer_v<F> && std::is_function_v<std::remove_pointer_t<F>>) {
    entry = &Refuse<F>::call;
  } else {
    entry = nullptr;
  }
}

// Fills the table: every entry refuses, then the calls above take their places.
struct Table {
  Table() {
    cl_icd_dispatch& d = dispatch_table;
    // A table of every entry of the dispatch table, in its order, laid out by hand:
    // clang-format off
#define ACCELPOOL_REFUSE(name) refuse(d.name);
    ACCELPOOL_REFUSE(clGetPlatformIDs) ACCELPOOL_REFUSE(clGetPlatformInfo) ACCELPOOL_REFUSE(clGetDeviceIDs)
    ACCELPOOL_REFUSE(clGetDeviceInfo) ACCELPOOL_REFUSE(clCreateContext) ACCELPOOL_REFUSE(clCreateContextFromType)
    ACCELPOOL_REFUSE(clRetainContext) ACCELPOOL_REFUSE(clReleaseContext) ACCELPOOL_REFUSE(clGetContextInfo)
    ACCELPOOL_REFUSE(clCreateCommandQueue) ACCELPOOL_REFUSE(clRetainCommandQueue) ACCELPOOL_REFUSE(clReleaseCommandQueue)
    ACCELPOOL_REFUSE(clGetCommandQueueInfo) ACCELPOOL_REFUSE(clSetCommandQueueProperty) ACCELPOOL_REFUSE(clCreateBuffer)
    ACCELPOOL_REFUSE(clCreateImage2D) ACCELPOOL_REFUSE(clCreateImage3D) ACCELPOOL_REFUSE(clRetainMemObject)
    ACCELPOOL_REFUSE(clReleaseMemObject) ACCELPOOL_REFUSE(clGetSupportedImageFormats) ACCELPOOL_REFUSE(clGetMemObjectInfo)
    ACCELPOOL_REFUSE(clGetImageInfo) ACCELPOOL_REFUSE(clCreateSampler) ACCELPOOL_REFUSE(clRetainSampler)
    ACCELPOOL_REFUSE(clReleaseSampler) ACCELPOOL_REFUSE(clGetSamplerInfo) ACCELPOOL_REFUSE(clCreateProgramWithSource)
    ACCELPOOL_REFUSE(clCreateProgramWithBinary) ACCELPOOL_REFUSE(clRetainProgram) ACCELPOOL_REFUSE(clReleaseProgram)
    ACCELPOOL_REFUSE(clBuildProgram) ACCELPOOL_REFUSE(clUnloadCompiler) ACCELPOOL_REFUSE(clGetProgramInfo)
    ACCELPOOL_REFUSE(clGetProgramBuildInfo) ACCELPOOL_REFUSE(clCreateKernel) ACCELPOOL_REFUSE(clCreateKernelsInProgram)
    ACCELPOOL_REFUSE(clRetainKernel) ACCELPOOL_REFUSE(clReleaseKernel) ACCELPOOL_REFUSE(clSetKernelArg)
    ACCELPOOL_REFUSE(clGetKernelInfo) ACCELPOOL_REFUSE(clGetKernelWorkGroupInfo) ACCELPOOL_REFUSE(clWaitForEvents)
    ACCELPOOL_REFUSE(clGetEventInfo) ACCELPOOL_REFUSE(clRetainEvent) ACCELPOOL_REFUSE(clReleaseEvent)
    ACCELPOOL_REFUSE(clGetEventProfilingInfo) ACCELPOOL_REFUSE(clFlush) ACCELPOOL_REFUSE(clFinish)
    ACCELPOOL_REFUSE(clEnqueueReadBuffer) ACCELPOOL_REFUSE(clEnqueueWriteBuffer) ACCELPOOL_REFUSE(clEnqueueCopyBuffer)
    ACCELPOOL_REFUSE(clEnqueueReadImage) ACCELPOOL_REFUSE(clEnqueueWriteImage) ACCELPOOL_REFUSE(clEnqueueCopyImage)
    ACCELPOOL_REFUSE(clEnqueueCopyImageToBuffer) ACCELPOOL_REFUSE(clEnqueueCopyBufferToImage)
    ACCELPOOL_REFUSE(clEnqueueMapBuffer) ACCELPOOL_REFUSE(clEnqueueMapImage) ACCELPOOL_REFUSE(clEnqueueUnmapMemObject)
    ACCELPOOL_REFUSE(clEnqueueNDRangeKernel) ACCELPOOL_REFUSE(clEnqueueTask) ACCELPOOL_REFUSE(clEnqueueNativeKernel)
    ACCELPOOL_REFUSE(clEnqueueMarker) ACCELPOOL_REFUSE(clEnqueueWaitForEvents) ACCELPOOL_REFUSE(clEnqueueBarrier)
    ACCELPOOL_REFUSE(clGetExtensionFunctionAddress) ACCELPOOL_REFUSE(clCreateFromGLBuffer)
    ACCELPOOL_REFUSE(clCreateFromGLTexture2D) ACCELPOOL_REFUSE(clCreateFromGLTexture3D)
    ACCELPOOL_REFUSE(clCreateFromGLRenderbuffer) ACCELPOOL_REFUSE(clGetGLObjectInfo) ACCELPOOL_REFUSE(clGetGLTextureInfo)
    ACCELPOOL_REFUSE(clEnqueueAcquireGLObjects) ACCELPOOL_REFUSE(clEnqueueReleaseGLObjects)
    ACCELPOOL_REFUSE(clGetGLContextInfoKHR) ACCELPOOL_REFUSE(clGetDeviceIDsFromD3D10KHR)
    ACCELPOOL_REFUSE(clCreateFromD3D10BufferKHR) ACCELPOOL_REFUSE(clCreateFromD3D10Texture2DKHR)
    ACCELPOOL_REFUSE(clCreateFromD3D10Texture3DKHR) ACCELPOOL_REFUSE(clEnqueueAcquireD3D10ObjectsKHR)
    ACCELPOOL_REFUSE(clEnqueueReleaseD3D10ObjectsKHR) ACCELPOOL_REFUSE(clSetEventCallback)
    ACCELPOOL_REFUSE(clCreateSubBuffer) ACCELPOOL_REFUSE(clSetMemObjectDestructorCallback)
    ACCELPOOL_REFUSE(clCreateUserEvent) ACCELPOOL_REFUSE(clSetUserEventStatus) ACCELPOOL_REFUSE(clEnqueueReadBufferRect)
    ACCELPOOL_REFUSE(clEnqueueWriteBufferRect) ACCELPOOL_REFUSE(clEnqueueCopyBufferRect)
    ACCELPOOL_REFUSE(clCreateSubDevicesEXT) ACCELPOOL_REFUSE(clRetainDeviceEXT) ACCELPOOL_REFUSE(clReleaseDeviceEXT)
    ACCELPOOL_REFUSE(clCreateEventFromGLsyncKHR) ACCELPOOL_REFUSE(clCreateSubDevices) ACCELPOOL_REFUSE(clRetainDevice)
    ACCELPOOL_REFUSE(clReleaseDevice) ACCELPOOL_REFUSE(clCreateImage) ACCELPOOL_REFUSE(clCreateProgramWithBuiltInKernels)
    ACCELPOOL_REFUSE(clCompileProgram) ACCELPOOL_REFUSE(clLinkProgram) ACCELPOOL_REFUSE(clUnloadPlatformCompiler)
    ACCELPOOL_REFUSE(clGetKernelArgInfo) ACCELPOOL_REFUSE(clEnqueueFillBuffer) ACCELPOOL_REFUSE(clEnqueueFillImage)
    ACCELPOOL_REFUSE(clEnqueueMigrateMemObjects) ACCELPOOL_REFUSE(clEnqueueMarkerWithWaitList)
    ACCELPOOL_REFUSE(clEnqueueBarrierWithWaitList) ACCELPOOL_REFUSE(clGetExtensionFunctionAddressForPlatform)
    ACCELPOOL_REFUSE(clCreateFromGLTexture) ACCELPOOL_REFUSE(clGetDeviceIDsFromD3D11KHR)
    ACCELPOOL_REFUSE(clCreateFromD3D11BufferKHR) ACCELPOOL_REFUSE(clCreateFromD3D11Texture2DKHR)
    ACCELPOOL_REFUSE(clCreateFromD3D11Texture3DKHR) ACCELPOOL_REFUSE(clCreateFromDX9MediaSurfaceKHR)
    ACCELPOOL_REFUSE(clEnqueueAcquireD3D11ObjectsKHR) ACCELPOOL_REFUSE(clEnqueueReleaseD3D11ObjectsKHR)
    ACCELPOOL_REFUSE(clGetDeviceIDsFromDX9MediaAdapterKHR) ACCELPOOL_REFUSE(clEnqueueAcquireDX9MediaSurfacesKHR)
    ACCELPOOL_REFUSE(clEnqueueReleaseDX9MediaSurfacesKHR) ACCELPOOL_REFUSE(clCreateFromEGLImageKHR)
    ACCELPOOL_REFUSE(clEnqueueAcquireEGLObjectsKHR) ACCELPOOL_REFUSE(clEnqueueReleaseEGLObjectsKHR)
    ACCELPOOL_REFUSE(clCreateEventFromEGLSyncKHR) ACCELPOOL_REFUSE(clCreateCommandQueueWithProperties)
    ACCELPOOL_REFUSE(clCreatePipe) ACCELPOOL_REFUSE(clGetPipeInfo) ACCELPOOL_REFUSE(clSVMAlloc) ACCELPOOL_REFUSE(clSVMFree)
    ACCELPOOL_REFUSE(clEnqueueSVMFree) ACCELPOOL_REFUSE(clEnqueueSVMMemcpy) ACCELPOOL_REFUSE(clEnqueueSVMMemFill)
    ACCELPOOL_REFUSE(clEnqueueSVMMap) ACCELPOOL_REFUSE(clEnqueueSVMUnmap) ACCELPOOL_REFUSE(clCreateSamplerWithProperties)
    ACCELPOOL_REFUSE(clSetKernelArgSVMPointer) ACCELPOOL_REFUSE(clSetKernelExecInfo)
    ACCELPOOL_REFUSE(clGetKernelSubGroupInfoKHR) ACCELPOOL_REFUSE(clCloneKernel) ACCELPOOL_REFUSE(clCreateProgramWithIL)
    ACCELPOOL_REFUSE(clEnqueueSVMMigrateMem) ACCELPOOL_REFUSE(clGetDeviceAndHostTimer) ACCELPOOL_REFUSE(clGetHostTimer)
    ACCELPOOL_REFUSE(clGetKernelSubGroupInfo) ACCELPOOL_REFUSE(clSetDefaultDeviceCommandQueue)
    ACCELPOOL_REFUSE(clSetProgramReleaseCallback) ACCELPOOL_REFUSE(clSetProgramSpecializationConstant)
    ACCELPOOL_REFUSE(clCreateBufferWithProperties) ACCELPOOL_REFUSE(clCreateImageWithProperties)
    ACCELPOOL_REFUSE(clSetContextDestructorCallback)
#undef ACCELPOOL_REFUSE
        // clang-format on
        d.clGetPlatformIDs = get_platform_ids;
    d.clGetPlatformInfo = get_platform_info;
    d.clGetDeviceIDs = get_device_ids;
    d.clGetDeviceInfo = get_device_info;
    d.clRetainDevice = retain_device;
    d.clReleaseDevice = retain_device;
    d.clCreateContext = create_context;
    d.clCreateContextFromType = create_context_from_type;
    d.clRetainContext = retain_context;
    d.clReleaseContext = release_context;
    d.clGetContextInfo = get_context_info;
    d.clCreateCommandQueue = create_queue;
    d.clCreateCommandQueueWithProperties = create_queue_with_properties;
    d.clRetainCommandQueue = retain_queue;
    d.clReleaseCommandQueue = release_queue;
    d.clGetCommandQueueInfo = get_queue_info;
    d.clFlush = flush;
    d.clFinish = finish;
    d.clCreateBuffer = create_buffer;
    d.clRetainMemObject = retain_mem;
    d.clReleaseMemObject = release_mem;
    d.clGetMemObjectInfo = get_mem_info;
    d.clGetSupportedImageFormats = get_image_formats;
    d.clEnqueueReadBuffer = enqueue_read_buffer;
    d.clEnqueueWriteBuffer = enqueue_write_buffer;
    d.clEnqueueCopyBuffer = enqueue_copy_buffer;
    d.clEnqueueFillBuffer = enqueue_fill_buffer;
    d.clEnqueueMapBuffer = enqueue_map_buffer;
    d.clEnqueueUnmapMemObject = enqueue_unmap;
    d.clCreateProgramWithSource = create_program_with_source;
    d.clCreateProgramWithBinary = create_program_with_binary;
    d.clRetainProgram = retain_program;
    d.clReleaseProgram = release_program;
    d.clBuildProgram = build_program;
    d.clGetProgramInfo = get_program_info;
    d.clGetProgramBuildInfo = get_program_build_info;
    d.clUnloadCompiler = unload_compiler;
    d.clUnloadPlatformCompiler = unload_platform_compiler;
    d.clCreateKernel = create_kernel;
    d.clCreateKernelsInProgram = create_kernels_in_program;
    d.clRetainKernel = retain_kernel;
    d.clReleaseKernel = release_kernel;
    d.clSetKernelArg = set_kernel_arg;
    d.clGetKernelInfo = get_kernel_info;
    d.clGetKernelWorkGroupInfo = get_kernel_work_group_info;
    d.clGetKernelArgInfo = get_kernel_arg_info;
    d.clEnqueueNDRangeKernel = enqueue_ndrange;
    d.clEnqueueTask = enqueue_task;
    d.clEnqueueMarker = enqueue_marker;
    d.clEnqueueBarrier = enqueue_barrier;
    d.clEnqueueWaitForEvents = enqueue_wait_for_events;
    d.clEnqueueMarkerWithWaitList = enqueue_marker_with_wait_list;
    d.clEnqueueBarrierWithWaitList = enqueue_barrier_with_wait_list;
    d.clWaitForEvents = wait_for_events;
    d.clGetEventInfo = get_event_info;
    d.clRetainEvent = retain_event;
    d.clReleaseEvent = release_event;
    d.clGetEventProfilingInfo = get_event_profiling_info;
  }
};
Table table;

}  // namespace

ACCELPOOL_EXPORT cl_int CL_API_CALL clIcdGetPlatformIDsKHR(cl_uint num_entries, cl_platform_id* platforms,
                                                           cl_uint* num_platforms) {
  return get_platform_ids(num_entries, platforms, num_platforms);
}

ACCELPOOL_EXPORT void* CL_API_CALL clGetExtensionFunctionAddress(const char* name) {
  if (name != nullptr && std::strcmp(name, "clIcdGetPlatformIDsKHR") == 0)
    return reinterpret_cast<void*>(&clIcdGetPlatformIDsKHR);
  return nullptr;
}

ACCELPOOL_EXPORT cl_int CL_API_CALL clGetPlatformInfo(cl_platform_id platform, cl_platform_info param, std::size_t size,
                                                      void* value, std::size_t* size_ret) {
  return get_platform_info(platform, param, size, value, size_ret);
}

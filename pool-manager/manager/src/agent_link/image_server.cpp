#include "image_server.hpp"

#include <accelpool/bitstreams/base64.hpp>
#include <accelpool/bitstreams/manifest.hpp>

#include <limits>

namespace accelpool::agent {

namespace json = boost::json;

ImageServer::ImageServer(std::shared_ptr<bitstreams::SharedRegistry> registry)
    : registry_(std::move(registry)), worker_([this] { work(); }) {}

ImageServer::~ImageServer() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  worker_.join();
}

void ImageServer::serve(std::shared_ptr<Link> link, Message request) {
  {
    std::lock_guard lock(mu_);
    int& queued = queued_[link.get()];
    if (queued < kMaxQueuedPerLink) {
      ++queued;
      jobs_.push_back({std::move(link), std::move(request)});
      wake_.notify_one();
      return;
    }
  }
  if (request.has_id) {
    link->send(error_line(request.id, make_error(Errc::unavailable, request.method + ": more than " +
                                                                        std::to_string(kMaxQueuedPerLink) +
                                                                        " image requests of this agent wait already")),
               false);
  }
}

void ImageServer::work() {
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
    if (stopping_) return;
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    std::string line;
    if (job.request.has_id) {
      Status s;
      json::value result = answer(job.request, s);
      line = s ? result_line(job.request.id, std::move(result)) : error_line(job.request.id, s.error());
    }
    lock.lock();
    // Counted out before its answer leaves: an agent that sends its next request on that answer finds the place.
    if (auto it = queued_.find(job.link.get()); it != queued_.end() && --it->second <= 0) queued_.erase(it);
    if (line.empty()) continue;
    lock.unlock();
    job.link->send(std::move(line), false);
    lock.lock();
  }
}

json::value ImageServer::answer(const Message& m, Status& status) const {
  const std::string& where = m.method;
  const bool read = m.method == "image.read";
  if (!read && m.method != "image.manifest") {
    status = make_error(Errc::method_not_found, "no method '" + m.method + "'");
    return nullptr;
  }
  if (auto s = only_fields(m.params, read ? "sha256,offset,length" : "sha256", where); !s) {
    status = s;
    return nullptr;
  }
  auto sha256 = get_string(m.params, "sha256", where, true);
  auto offset = get_uint(m.params, "offset", where, std::numeric_limits<std::uint64_t>::max());
  auto length = get_uint(m.params, "length", where, kImageChunk);
  for (const Status& s : {sha256.status(), offset.status(), length.status()}) {
    if (!s) {
      status = s;
      return nullptr;
    }
  }
  if (read && *length == 0) {
    status = make_error(Errc::invalid_argument, where + ": field 'length' must be 1.." + std::to_string(kImageChunk));
    return nullptr;
  }
  if (!registry_) {
    status = make_error(Errc::not_found, where + ": this manager has no bitstream registry");
    return nullptr;
  }
  if (!read) {
    auto b = registry_->find_by_sha256(*sha256);
    if (!b) {
      status = make_error(b.error().code, where + ": " + b.error().message);
      return nullptr;
    }
    return json::object{{"manifest", bitstreams::to_toml(b->manifest)}, {"size", b->size_bytes}};
  }
  std::uint64_t size = 0;
  auto bytes = registry_->read_image(*sha256, *offset, static_cast<std::size_t>(*length), size);
  if (!bytes) {
    status = make_error(bytes.error().code, where + ": " + bytes.error().message);
    return nullptr;
  }
  return json::object{{"data", bitstreams::base64_encode(*bytes)}, {"size", size}};
}

}  // namespace accelpool::agent

// ImageServer: the manager's side of image.manifest and image.read (docs/agent-protocol.md, "Images"). The
// listener hands it an admitted agent's request; a worker thread of its own looks the image up, reads the asked
// piece (at most agent::kImageChunk bytes) and queues the answer on the agent's link. No image file is read on
// the owner thread or the listener's I/O thread. Internal to the agent link.
#pragma once

#include "link.hpp"

#include <accelpool/agent/wire.hpp>
#include <accelpool/bitstreams/shared_registry.hpp>

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

namespace accelpool::agent {

class ImageServer {
 public:
  // At most this many requests of one link wait or run at once; more are refused with "unavailable" (an agent
  // keeps at most that many unanswered, so only a misbehaving one meets it), so no agent fills the manager's memory.
  static constexpr int kMaxQueuedPerLink = kMaxImageRequests;

  // Serves the images of `registry` (null: none; every request is "not_found").
  explicit ImageServer(std::shared_ptr<bitstreams::SharedRegistry> registry);
  // Stops the worker after the request it is serving; what is still queued is dropped (its link is closing).
  ~ImageServer();
  ImageServer(const ImageServer&) = delete;
  ImageServer& operator=(const ImageServer&) = delete;

  // Answers `request` (image.manifest or image.read, from an admitted agent) on the worker: its reply, or error,
  // goes to `link`'s output and wakes the link's I/O thread. A notification gets no reply. Any thread.
  //   image.manifest {sha256} -> {"manifest": TOML text, "size": bytes}
  //   image.read {sha256, offset, length (1..kImageChunk)} -> {"data": base64 of the bytes from offset, at most
  //   length, none at or past the end, "size": bytes}
  // Errors: "invalid_argument" (unknown method or field, wrong type, length out of range; names the field),
  // "not_found" (no image with that sha256), "io_error" (the file cannot be read), "unavailable" (too many
  // requests of this link waiting).
  void serve(std::shared_ptr<Link> link, Message request);

 private:
  struct Job {
    std::shared_ptr<Link> link;
    Message request;
  };
  void work();
  boost::json::value answer(const Message& request, Status& status) const;

  std::shared_ptr<bitstreams::SharedRegistry> registry_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Job> jobs_;
  std::map<const Link*, int> queued_;  // requests per link waiting or running
  bool stopping_ = false;
  std::thread worker_;  // last: started once everything above exists
};

}  // namespace accelpool::agent

// Finding the host end of a virtio-serial channel of each running VM: the Unix socket libvirt binds for a
// `<channel type='unix'>` whose `<target type='virtio' name='NAME'/>` matches. The host agent relays what it
// finds to the manager (docs/agent-protocol.md, "Relaying guest ports").
#pragma once

#include <accelpool/common/result.hpp>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace accelpool::hypervisor {

// One running VM that has the channel.
struct DomainChannel {
  std::string vm;      // the domain name
  std::string uuid;    // its UUID
  std::string socket;  // host path of the channel's Unix socket (from the live domain XML)
};

// The socket path of the virtio channel `name` in a domain definition (virDomainGetXMLDesc output), or nullopt
// when the domain has no such unix channel. Errors: "invalid_argument" on malformed XML.
Result<std::optional<std::string>> channel_socket_path(std::string_view domain_xml, std::string_view name);

// Lists the running domains of one libvirt connection that have a given channel. Owns its own connection
// (no events), opened on first use and again after it breaks. Not thread-safe: one caller thread.
class ChannelFinder {
 public:
  // Does not connect yet. Errors: "invalid_argument" (empty uri or channel name).
  static Result<std::unique_ptr<ChannelFinder>> create(std::string uri, std::string channel);
  virtual ~ChannelFinder() = default;

  // Every running domain with the channel, in name order. Blocks briefly (one libvirt round trip per domain).
  // Domains that end while they are listed are skipped. Errors: "unavailable" (no daemon answers; the next call
  // tries to connect again), "hypervisor" (libvirt refused the listing; its message is included).
  virtual Result<std::vector<DomainChannel>> list() = 0;
};

}  // namespace accelpool::hypervisor

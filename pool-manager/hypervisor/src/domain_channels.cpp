#include <accelpool/hypervisor/domain_channels.hpp>

#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>
#include <libxml/parser.h>
#include <libxml/xpath.h>

#include <algorithm>
#include <climits>
#include <cstdlib>

namespace accelpool::hypervisor {

namespace {

// XPath string literals cannot escape quotes: a name holding both kinds is refused by the caller.
std::string xpath_literal(std::string_view s) {
  char q = s.find('\'') == std::string_view::npos ? '\'' : '"';
  return q + std::string(s) + q;
}

std::string libvirt_message() {
  const char* m = virGetLastErrorMessage();
  return m != nullptr ? m : "unknown libvirt error";
}

class LibvirtChannelFinder final : public ChannelFinder {
 public:
  LibvirtChannelFinder(std::string uri, std::string channel) : uri_(std::move(uri)), channel_(std::move(channel)) {}
  ~LibvirtChannelFinder() override { disconnect(); }

  Result<std::vector<DomainChannel>> list() override {
    if (conn_ != nullptr && virConnectIsAlive(conn_) != 1) disconnect();
    if (conn_ == nullptr) {
      conn_ = virConnectOpen(uri_.c_str());
      if (conn_ == nullptr) return make_error(Errc::unavailable, "libvirt '" + uri_ + "': " + libvirt_message());
    }
    virDomainPtr* doms = nullptr;
    int n = virConnectListAllDomains(conn_, &doms, VIR_CONNECT_LIST_DOMAINS_ACTIVE);
    if (n < 0) {
      std::string why = libvirt_message();
      disconnect();
      return make_error(Errc::hypervisor, "libvirt '" + uri_ + "': listing domains: " + why);
    }
    std::vector<DomainChannel> out;
    for (int i = 0; i < n; ++i) {
      virDomainPtr d = doms[i];
      const char* name = virDomainGetName(d);
      char uuid[VIR_UUID_STRING_BUFLEN] = {};
      char* xml = virDomainGetXMLDesc(d, 0);  // live definition: libvirt fills in generated socket paths
      if (name != nullptr && xml != nullptr && virDomainGetUUIDString(d, uuid) == 0) {
        auto path = channel_socket_path(xml, channel_);
        if (path && *path) out.push_back({name, uuid, **path});
      }
      std::free(xml);
      virDomainFree(d);
    }
    std::free(doms);
    std::sort(out.begin(), out.end(), [](const DomainChannel& a, const DomainChannel& b) { return a.vm < b.vm; });
    return out;
  }

 private:
  void disconnect() {
    if (conn_ != nullptr) virConnectClose(conn_);
    conn_ = nullptr;
  }

  std::string uri_;
  std::string channel_;
  virConnectPtr conn_ = nullptr;
};

}  // namespace

Result<std::optional<std::string>> channel_socket_path(std::string_view domain_xml, std::string_view name) {
  if (name.find('\'') != std::string_view::npos && name.find('"') != std::string_view::npos)
    return make_error(Errc::invalid_argument, "channel name '" + std::string(name) + "' holds both kinds of quote");
  if (domain_xml.size() > static_cast<std::size_t>(INT_MAX))
    return make_error(Errc::invalid_argument, "domain XML too large");
  xmlDocPtr doc = xmlReadMemory(domain_xml.data(), static_cast<int>(domain_xml.size()), "domain.xml", nullptr,
                                XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
  if (doc == nullptr) return make_error(Errc::invalid_argument, "domain XML is not well-formed");
  std::string expr = "/domain/devices/channel[@type='unix'][target[@type='virtio' and @name=" + xpath_literal(name) +
                     "]]/source/@path";
  std::optional<std::string> found;
  xmlXPathContextPtr ctx = xmlXPathNewContext(doc);
  xmlXPathObjectPtr res =
      ctx != nullptr ? xmlXPathEvalExpression(reinterpret_cast<const xmlChar*>(expr.c_str()), ctx) : nullptr;
  if (res != nullptr && res->nodesetval != nullptr && res->nodesetval->nodeNr > 0) {
    xmlChar* v = xmlNodeGetContent(res->nodesetval->nodeTab[0]);
    if (v != nullptr) {
      found = std::string(reinterpret_cast<const char*>(v));
      xmlFree(v);
    }
  }
  xmlXPathFreeObject(res);
  xmlXPathFreeContext(ctx);
  xmlFreeDoc(doc);
  return found;
}

Result<std::unique_ptr<ChannelFinder>> ChannelFinder::create(std::string uri, std::string channel) {
  if (uri.empty()) return make_error(Errc::invalid_argument, "channel finder: empty libvirt URI");
  if (channel.empty()) return make_error(Errc::invalid_argument, "channel finder: empty channel name");
  return std::unique_ptr<ChannelFinder>(std::make_unique<LibvirtChannelFinder>(std::move(uri), std::move(channel)));
}

}  // namespace accelpool::hypervisor

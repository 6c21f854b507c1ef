// The XML the attacher exchanges with libvirt, checked without a daemon: parsed back with libxml2 through the
// same functions the attacher uses.
#include "libvirt_harness.hpp"

#include <accelpool/hypervisor/libvirt_attacher.hpp>
#include <accelpool/hypervisor/libvirt_xml.hpp>

#include <catch2/catch.hpp>

#include <set>

using namespace accelpool;
using namespace accelpool::hypervisor;

TEST_CASE("device ids escape injectively into valid aliases and shmem names", "[hypervisor]") {
  const std::vector<std::string> ids = {"sim:3", "sim_3a3", "sim-3", "xrt:0000:65:00.1", "opencl:0:0/2", "a.b",
                                        "a_2eb", "A",       "a"};
  std::set<std::string> aliases;
  for (const auto& id : ids) {
    const std::string alias = device_alias(id, 0x1f);
    CHECK(alias.rfind("ua-accelpool-", 0) == 0);
    // libvirt keeps a user alias only if it is made of [A-Za-z0-9_-]; QEMU ids allow the same.
    CHECK(alias.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") ==
          std::string::npos);
    CHECK(shmem_name(id).find('/') == std::string::npos);
    aliases.insert(alias);
  }
  CHECK(aliases.size() == ids.size());
  CHECK(device_alias("sim:3", 0x1f) == "ua-accelpool-sim_3a3_p1f");
  CHECK(shmem_name("sim:3") == "accelpool-sim_3a3");
}

TEST_CASE("every attachment of a device has an alias of its own, and aliases of both forms name their device",
          "[hypervisor]") {
  // Two attachments of one device: different aliases, and so different ivshmem memory-backend ids in QEMU.
  const std::uint64_t first = 0x62a1b2c3d4e5f;
  CHECK(device_alias("sim:3", first) != device_alias("sim:3", first + 1));
  auto a = device_xml(DeviceSpec{"sim:3", "lease-1", AttachMethod::emulated, ""}, first, 1);
  auto b = device_xml(DeviceSpec{"sim:3", "lease-1", AttachMethod::emulated, ""}, first + 1, 1);
  REQUIRE(a.is_ok());
  REQUIRE(b.is_ok());
  CHECK(*a != *b);

  for (const char* id : {"sim:3", "xrt:0000:65:00.1", "a_2eb", "p", "_p", "A", "sim-p1"}) {
    for (const std::uint64_t n : {std::uint64_t{0}, first, ~std::uint64_t{0}}) {
      INFO(id << " attachment " << n);
      auto parsed = parse_device_alias(device_alias(id, n));
      REQUIRE(parsed.is_ok());
      CHECK(parsed->device_id == id);
      CHECK(parsed->attachment == n);
    }
  }

  // The form agents wrote before aliases had an attachment number, still in the VMs they attached to.
  auto old = parse_device_alias("ua-accelpool-xrt_3a0000_3a65_3a00_2e1");
  REQUIRE(old.is_ok());
  CHECK(old->device_id == "xrt:0000:65:00.1");
  CHECK_FALSE(old->attachment.has_value());

  for (const char* alias : {"ua-other-sim_3a3", "usb", "ua-accelpool-", "ua-accelpool-sim_3A3", "ua-accelpool-sim_3",
                            "ua-accelpool-_41", "ua-accelpool-sim_3a3_p", "ua-accelpool-sim_3a3_pX1",
                            "ua-accelpool-sim_3a3_p1f_p2", "ua-accelpool-sim_3a3_p10000000000000000"}) {
    INFO(alias);
    auto refused = parse_device_alias(alias);
    REQUIRE_FALSE(refused.is_ok());
    CHECK(refused.error().code == Errc::invalid_argument);
    CHECK(refused.error().message.find(alias) != std::string::npos);
  }
}

TEST_CASE("device ids and specs are validated", "[hypervisor]") {
  CHECK(validate_device_id("sim:0").is_ok());
  CHECK(validate_device_id("").error().code == Errc::invalid_argument);
  CHECK(validate_device_id("has space").error().code == Errc::invalid_argument);
  CHECK(validate_device_id(std::string(kMaxDeviceIdLength + 1, 'x')).error().code == Errc::invalid_argument);

  DeviceSpec spec{"sim:0", "lease-1", AttachMethod::emulated, ""};
  CHECK(validate_spec(spec).is_ok());
  spec.lease_id.clear();
  auto st = validate_spec(spec);
  REQUIRE_FALSE(st.is_ok());
  CHECK(st.error().message.find("lease id") != std::string::npos);
}

TEST_CASE("PCI addresses are normalised or rejected with the reason", "[hypervisor]") {
  CHECK(*normalize_bdf("0000:65:00.1") == "0000:65:00.1");
  CHECK(*normalize_bdf("65:00.1") == "0000:65:00.1");
  CHECK(*normalize_bdf("000A:Af:1F.7") == "000a:af:1f.7");
  for (const char* bad :
       {"", "65:00", "65:00.8", "65:20.0", "0000:65:00:1", "g0:00.0", "00000:65:00.1", "0000:65:00.1 ", "65-00.1"}) {
    auto r = normalize_bdf(bad);
    INFO(bad);
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.error().code == Errc::invalid_argument);
    CHECK(r.error().message.find("PCI address") != std::string::npos);
  }
}

TEST_CASE("device XML for hot-plug names the device by its alias", "[hypervisor]") {
  auto shm = device_xml(DeviceSpec{"sim:7", "l", AttachMethod::emulated, ""}, 0xa, 4);
  REQUIRE(shm.is_ok());
  CHECK(*shm ==
        "<shmem name='accelpool-sim_3a7'><model type='ivshmem-plain'/><size unit='M'>4</size>"
        "<alias name='ua-accelpool-sim_3a7_pa'/></shmem>");
  auto pci = device_xml(DeviceSpec{"xrt:0", "l", AttachMethod::pci_hostdev, "65:00.1"}, 0xb, 1);
  REQUIRE(pci.is_ok());
  CHECK(pci->find("<hostdev mode='subsystem' type='pci' managed='yes'>") == 0);
  CHECK(pci->find("<address domain='0x0000' bus='0x65' slot='0x00' function='0x1'/>") != std::string::npos);
  CHECK(pci->find("<alias name='ua-accelpool-xrt_3a0_pb'/>") != std::string::npos);

  CHECK(device_xml(DeviceSpec{"sim:7", "l", AttachMethod::emulated, ""}, 1, 3).error().code == Errc::invalid_argument);
  CHECK(device_xml(DeviceSpec{"xrt:0", "l", AttachMethod::pci_hostdev, "zz"}, 1, 1).error().code ==
        Errc::invalid_argument);
}

TEST_CASE("metadata round-trips, also as libvirt hands it back", "[hypervisor]") {
  AttachedDevice a;
  a.device_id = "sim:1";
  a.lease_id = "lease <&'\"> 1";
  a.method = AttachMethod::emulated;
  a.alias = device_alias(a.device_id, 1);
  a.state = AttachState::quarantined;
  a.note = "no confirmation";
  AttachedDevice b;
  b.device_id = "xrt:0000:65:00.1";
  b.lease_id = "L2";
  b.method = AttachMethod::pci_hostdev;
  b.pci_bdf = "0000:65:00.1";
  b.alias = "ua-accelpool-xrt_3a0000_3a65_3a00_2e1";  // the older form, as agents before attachment numbers wrote it
  b.state = AttachState::detaching;

  auto back = parse_metadata_xml(metadata_xml({a, b}));
  REQUIRE(back.is_ok());
  REQUIRE(back->size() == 2);
  CHECK((*back)[0].lease_id == a.lease_id);
  CHECK((*back)[0].state == AttachState::quarantined);
  CHECK((*back)[0].note == "no confirmation");
  CHECK((*back)[0].alias == a.alias);
  CHECK((*back)[1].alias == b.alias);
  CHECK((*back)[1].method == AttachMethod::pci_hostdev);
  CHECK((*back)[1].pci_bdf == "0000:65:00.1");
  CHECK((*back)[1].state == AttachState::detaching);

  // libvirt returns the element with the namespace prefix it was stored under.
  auto prefixed = parse_metadata_xml(
      "<accelpool:accelpool xmlns:accelpool=\"https://accelpool.dev/xmlns/libvirt/1\" version=\"1\">\n"
      "  <accelpool:device id=\"sim:1\" lease=\"L\" method=\"emulated\" alias=\"ua-accelpool-sim_3a1\" "
      "state=\"attached\"/>\n</accelpool:accelpool>");
  REQUIRE(prefixed.is_ok());
  REQUIRE(prefixed->size() == 1);
  CHECK((*prefixed)[0].device_id == "sim:1");

  CHECK(parse_metadata_xml("").error().code == Errc::invalid_argument);
  CHECK(parse_metadata_xml("<accelpool><device id='x'/>").error().message.find("not well-formed") != std::string::npos);
  CHECK(parse_metadata_xml("<other/>").error().message.find("<accelpool>") != std::string::npos);
  auto bad_state =
      parse_metadata_xml("<accelpool><device id='x' lease='l' method='emulated' alias='a' state='lost'/></accelpool>");
  REQUIRE_FALSE(bad_state.is_ok());
  CHECK(bad_state.error().message.find("unknown state 'lost'") != std::string::npos);
  CHECK(parse_metadata_xml("<accelpool><device id='x'/></accelpool>").error().message.find("needs id") !=
        std::string::npos);
  CHECK(parse_metadata_xml("<accelpool/>")->empty());
}

TEST_CASE("device aliases are read from a domain definition", "[hypervisor]") {
  auto aliases = device_aliases(
      "<domain type='qemu'><name>x</name><devices><emulator>/q</emulator>"
      "<shmem name='s'><alias name='ua-accelpool-a'/></shmem><controller type='usb'><alias name='usb'/>"
      "</controller></devices><metadata><alias name='not-a-device'/></metadata></domain>");
  REQUIRE(aliases.is_ok());
  CHECK(*aliases == std::vector<std::string>{"ua-accelpool-a", "usb"});
  CHECK(device_aliases("<domain>").error().code == Errc::invalid_argument);
}

TEST_CASE("the guest PCI address of a device is read from a live domain definition by its alias", "[hypervisor]") {
  const std::string xml =
      "<domain type='qemu'><name>x</name><devices>"
      "<hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0x0000' bus='0x65' slot='0x00' "
      "function='0x1'/></source><alias name='ua-accelpool-h'/>"
      "<address type='pci' domain='0x0000' bus='0x00' slot='0x07' function='0x0'/></hostdev>"
      "<shmem name='s'><model type='ivshmem-plain'/><alias name='ua-accelpool-s'/>"
      "<address type='pci' domain='0x0000' bus='0x01' slot='0x1f' function='0x3'/></shmem>"
      "<controller type='usb'><alias name='usb'/></controller>"
      "<memballoon model='virtio'><alias name='bad'/><address type='pci' domain='0x0000' bus='0x00' slot='0x40' "
      "function='0x0'/></memballoon></devices></domain>";
  auto at = [&](const char* alias) {
    auto r = guest_pci_address(xml, alias);
    return r ? *r : "error: " + r.error().message;
  };
  // The hostdev's own address, not its host address inside <source>.
  CHECK(at("ua-accelpool-h") == "0000:00:07.0");
  CHECK(at("ua-accelpool-s") == "0000:01:1f.3");
  CHECK(at("usb") == "");  // no PCI address
  auto missing = guest_pci_address(xml, "ua-accelpool-none");
  REQUIRE_FALSE(missing.is_ok());
  CHECK(missing.error().code == Errc::not_found);
  auto bad = guest_pci_address(xml, "bad");  // slot 0x40 is past the 32 slots of a bus
  REQUIRE_FALSE(bad.is_ok());
  CHECK(bad.error().code == Errc::invalid_argument);
  CHECK(bad.error().message.find("'bad'") != std::string::npos);
  CHECK(guest_pci_address("<domain>", "x").error().code == Errc::invalid_argument);
}

TEST_CASE("the test VM builder writes an OS-less or a kernel-booting domain", "[hypervisor]") {
  testing::VmOptions o;
  o.name = "vm-a";
  auto plain = testing::domain_xml(o);
  REQUIRE(plain.is_ok());
  CHECK(plain->find("<domain type='qemu'>") == 0);
  CHECK(plain->find("machine='pc'>hvm</type>") != std::string::npos);
  CHECK(plain->find("<features><acpi/></features>") != std::string::npos);
  CHECK(plain->find("<kernel>") == std::string::npos);
  CHECK(plain->find("<disk") == std::string::npos);
  CHECK(plain->find("<interface") == std::string::npos);

  o.kernel = "/boot/vmlinuz";
  o.initrd = "/tmp/initrd.img";
  o.cmdline = "console=ttyS0 quiet";
  o.console_log = "/tmp/console.log";
  o.channels.push_back({"org.accelpool.guest.0", "/tmp/guest.sock"});
  auto linux_vm = testing::domain_xml(o);
  REQUIRE(linux_vm.is_ok());
  CHECK(linux_vm->find("<kernel>/boot/vmlinuz</kernel>") != std::string::npos);
  CHECK(linux_vm->find("<cmdline>console=ttyS0 quiet</cmdline>") != std::string::npos);
  CHECK(linux_vm->find("<serial type='file'><source path='/tmp/console.log'/>") != std::string::npos);
  CHECK(linux_vm->find("<target type='virtio' name='org.accelpool.guest.0'/>") != std::string::npos);

  testing::VmOptions bad;
  bad.name = "b";
  bad.cmdline = "x";
  CHECK(testing::domain_xml(bad).error().code == Errc::invalid_argument);
}

TEST_CASE("an attacher with bad options or no daemon fails with a clear error", "[hypervisor]") {
  LibvirtOptions o;
  o.uri = "qemu+unix:///system?socket=/nonexistent/accelpool/libvirt-sock";
  auto a = make_libvirt_attacher(o);
  REQUIRE_FALSE(a.is_ok());
  CHECK(a.error().code == Errc::unavailable);
  CHECK(a.error().message.find("/nonexistent/accelpool/libvirt-sock") != std::string::npos);

  o.detach_timeout = std::chrono::milliseconds(0);
  CHECK(make_libvirt_attacher(o).error().code == Errc::invalid_argument);
  o.detach_timeout = std::chrono::milliseconds(100);
  o.shmem_size_mib = 3;
  CHECK(make_libvirt_attacher(o).error().code == Errc::invalid_argument);
}

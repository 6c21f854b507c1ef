// The libvirt XML documents the attacher writes and reads: device definitions for hot-plug, the accelpool
// element in a domain's metadata, and the device aliases of a live domain definition. Pure functions, no
// connection to libvirt; the attacher and the tests share them.
#pragma once

#include <accelpool/common/result.hpp>
#include <accelpool/hypervisor/attacher.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace accelpool::hypervisor {

// Namespace URI and prefix of accelpool's element in a domain's <metadata>.
inline constexpr std::string_view kMetadataNamespace = "https://accelpool.dev/xmlns/libvirt/1";
inline constexpr std::string_view kMetadataKey = "accelpool";
// Every device accelpool plugs carries a user alias with this prefix (libvirt keeps "ua-" aliases).
inline constexpr std::string_view kAliasPrefix = "ua-accelpool-";
// Separates the escaped device id from the attachment number in an alias. escape_device_id writes '_' only before
// two lower-case hex digits, so this never occurs inside an escaped id.
inline constexpr std::string_view kAttachmentMarker = "_p";

// Longest pool device id and lease id accepted (the id ends up, escaped, in a file name under /dev/shm).
inline constexpr std::size_t kMaxDeviceIdLength = 80;
inline constexpr std::size_t kMaxLeaseIdLength = 200;

// Checks a device id: 1..kMaxDeviceIdLength printable ASCII characters, no spaces.
Status validate_device_id(std::string_view device_id);

// Checks a whole spec (ids, lease, BDF for pci_hostdev). Errors: "invalid_argument" naming the field.
Status validate_spec(const DeviceSpec& spec);

// "0000:65:00.1" or "65:00.1" (hex, case-insensitive) -> "0000:65:00.1". Errors: "invalid_argument".
Result<std::string> normalize_bdf(std::string_view bdf);

// A device id escaped into [A-Za-z0-9-] plus "_xx" hex escapes: injective, valid in libvirt user aliases,
// QEMU ids and file names. "sim:3" -> "sim_3a3".
std::string escape_device_id(std::string_view device_id);

// "ua-accelpool-<escaped id>_p<attachment in lower-case hex>": the alias the device carries in the VM for one
// attachment. The attacher gives every attachment a new number, so a device plugged again into the VM that just
// released it gets a new alias, and with it new ids for what libvirt derives from the alias (the ivshmem memory
// backend "shmmem-<alias>", whose QEMU RAMBlock "<guest PCI address>/shmmem-<alias>" is freed some time after
// libvirt reports the removal; plugged again at once into the same slot, the old alias aborts QEMU with "RAMBlock
// ... already registered").
std::string device_alias(std::string_view device_id, std::uint64_t attachment);

// What an accelpool alias names: the device, and the attachment number (none for the form agents wrote before
// aliases had one, "ua-accelpool-<escaped id>", still found in the VMs they attached to).
struct ParsedAlias {
  std::string device_id;
  std::optional<std::uint64_t> attachment;
};

// Reads an alias of either form. Errors: "invalid_argument" saying why, for an alias without kAliasPrefix or one
// that device_alias cannot have written (an escape that is not "_" plus two lower-case hex digits or not the
// shortest one, an empty id, an attachment number that is not 1-16 lower-case hex digits).
Result<ParsedAlias> parse_device_alias(std::string_view alias);

// "accelpool-<escaped id>": the shared-memory region an emulated device is backed by (/dev/shm/<name>).
std::string shmem_name(std::string_view device_id);

// Checks the size of an emulated device's shared-memory region: a power of two in 1..1024 MiB.
// Errors: "invalid_argument".
Status validate_shmem_size(std::uint32_t shmem_size_mib);

// The <hostdev> or <shmem> element for a live attach of `spec` as attachment number `attachment`, carrying
// device_alias(spec.device_id, attachment). Errors: "invalid_argument" (see validate_spec, validate_shmem_size).
Result<std::string> device_xml(const DeviceSpec& spec, std::uint64_t attachment, std::uint32_t shmem_size_mib);

// The accelpool metadata element for these records (state, lease and note included; `present` is not stored).
std::string metadata_xml(const std::vector<AttachedDevice>& devices);

// Parses what metadata_xml wrote, also as libvirt returns it (namespace prefixes added).
// Errors: "invalid_argument" saying what is wrong (malformed XML, unknown state, missing attribute).
Result<std::vector<AttachedDevice>> parse_metadata_xml(std::string_view xml);

// The alias of every device under <devices> of a domain definition (virDomainGetXMLDesc output).
// Errors: "invalid_argument" on malformed XML.
Result<std::vector<std::string>> device_aliases(std::string_view domain_xml);

// The PCI address at which the guest sees the device with `alias` in a live domain definition: the device's own
// <address type='pci' .../> as "DDDD:BB:SS.F" (lower-case hex), "" when libvirt gave it no PCI address.
// Errors: "not_found" (no device has that alias), "invalid_argument" (malformed XML or address).
Result<std::string> guest_pci_address(std::string_view domain_xml, std::string_view alias);

// Escapes text for use inside an XML attribute value or element.
std::string xml_escape(std::string_view text);

}  // namespace accelpool::hypervisor

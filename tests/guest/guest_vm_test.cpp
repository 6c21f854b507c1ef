// The accelpool guest image booted as a real VM: a private libvirtd with the QEMU driver (pure emulation) boots
// Debian's kernel with the image's initramfs, and the test watches the guest's serial console. It proves the
// paths the guest side relies on: the guest comes up, a hot-plugged emulated device reaches it, the guest
// acknowledges the eject so a detach completes, and bytes cross the virtio-serial port both ways.
// Skipped with a warning where the image could not be built or no libvirtd can run.
#include "libvirt_harness.hpp"

#include <accelpool/hypervisor/libvirt_attacher.hpp>
#include <accelpool/hypervisor/libvirt_xml.hpp>

#include <catch2/catch.hpp>

#include "skip.hpp"

#include <libvirt/libvirt.h>

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace accelpool;
using namespace accelpool::hypervisor;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kPortName = "org.accelpool.guest.0";

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

fs::path image_dir() {
  const char* env = std::getenv("ACCELPOOL_GUEST_IMAGE_DIR");
  return env != nullptr && *env != '\0' ? fs::path(env) : fs::path(ACCELPOOL_GUEST_IMAGE_DIR);
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Why the image cannot be used, or nothing when it can.
std::optional<std::string> image_unavailable(const fs::path& dir) {
  if (fs::exists(dir / "UNAVAILABLE")) return "the guest image could not be built: " + read_file(dir / "UNAVAILABLE");
  if (!fs::exists(dir / "initramfs.cpio.gz") || (!fs::exists(dir / "vmlinux") && !fs::exists(dir / "vmlinuz"))) {
    return "no guest image in " + dir.string() + " (build the target guest-image)";
  }
  return std::nullopt;
}

// The shared private libvirtd when the image in `dir` is usable and a daemon can run; otherwise skips the
// test, saying why, and returns nullptr.
hypervisor::testing::LibvirtDaemon* vm_prerequisites(const fs::path& dir) {
  if (auto why = image_unavailable(dir)) {
    accelpool::testing::skip(*why);
    return nullptr;
  }
  std::string why_not;
  auto* daemon = hypervisor::testing::LibvirtDaemon::shared(&why_not);
  if (daemon == nullptr) accelpool::testing::skip("no private libvirtd with the QEMU driver can run here: " + why_not);
  return daemon;
}

// A folder of the test's own for the console log and the channel socket; removed at the end.
struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/accelpool-guest-XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    const char* keep = std::getenv("ACCELPOOL_KEEP_LIBVIRTD_DIR");
    std::error_code ec;
    if (keep == nullptr || std::string(keep) != "1") fs::remove_all(path, ec);
  }
};

// The guest's serial console, written by QEMU to a file. Lines are matched from a cursor on, so each wait sees
// only what came after the previous match.
class Console {
 public:
  explicit Console(fs::path path) : path_(std::move(path)) {}

  // The first complete line after the cursor that contains every one of `needles`; moves the cursor past it.
  std::optional<std::string> wait_for(std::initializer_list<std::string> needles, std::chrono::seconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (true) {
      const std::string text = read_file(path_);
      std::size_t pos = cursor_;
      while (pos < text.size()) {
        const std::size_t end = text.find('\n', pos);
        if (end == std::string::npos) break;
        const std::string line = text.substr(pos, end - pos);
        pos = end + 1;
        bool all = true;
        for (const auto& n : needles) all = all && line.find(n) != std::string::npos;
        if (all) {
          cursor_ = pos;
          return line;
        }
      }
      if (Clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(25ms);
    }
  }

  std::string text() const { return read_file(path_); }
  std::string tail(std::size_t n = 2500) const {
    std::string t = text();
    return t.size() > n ? "..." + t.substr(t.size() - n) : t;
  }

 private:
  fs::path path_;
  std::size_t cursor_ = 0;
};

// Sends `message` into the host end of a virtio-serial channel and reads until as many bytes came back.
// Returns what came back (shorter on timeout).
std::string echo_through(const fs::path& socket_path, const std::string& message, std::chrono::seconds timeout) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  REQUIRE(socket_path.string().size() < sizeof(addr.sun_path));
  std::strncpy(addr.sun_path, socket_path.c_str(), sizeof(addr.sun_path) - 1);
  const int connected = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  INFO("connect " << socket_path << ": " << (connected == 0 ? "ok" : std::strerror(errno)));
  REQUIRE(connected == 0);
  // A small message fits the socket buffer: the write does not wait for the guest to read.
  REQUIRE(write(fd, message.data(), message.size()) == static_cast<ssize_t>(message.size()));
  std::string back;
  const auto deadline = Clock::now() + timeout;
  while (back.size() < message.size() && Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (poll(&p, 1, static_cast<int>(std::max<long>(left, 0))) <= 0) break;
    std::array<char, 512> buf{};
    const ssize_t n = read(fd, buf.data(), buf.size());
    if (n <= 0) break;
    back.append(buf.data(), static_cast<std::size_t>(n));
  }
  close(fd);
  return back;
}

std::unique_ptr<Attacher> attacher_for(hypervisor::testing::LibvirtDaemon& d) {
  LibvirtOptions o;
  o.uri = d.uri();
  o.detach_timeout = 40s;
  auto a = make_libvirt_attacher(o);
  INFO((a.is_ok() ? std::string() : a.error().message));
  REQUIRE(a.is_ok());
  return std::move(*a);
}

bool live_has_alias(hypervisor::testing::LibvirtDaemon& d, const std::string& vm, const std::string& alias) {
  auto xml = d.live_xml(vm);
  REQUIRE(xml.is_ok());
  auto aliases = device_aliases(*xml);
  REQUIRE(aliases.is_ok());
  return std::find(aliases->begin(), aliases->end(), alias) != aliases->end();
}

// Runs a shell command; returns its exit status and what it printed (stdout and stderr).
std::pair<int, std::string> run_command(const std::string& command) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  std::array<char, 4096> buf{};
  std::size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// DEVICE_REMOVED events of one domain, seen on a libvirt connection of the test's own.
struct RemovedEvents {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::string> aliases;

  static int on_removed(virConnectPtr, virDomainPtr, const char* alias, void* opaque) {
    auto* self = static_cast<RemovedEvents*>(opaque);
    std::lock_guard lock(self->mutex);
    self->aliases.emplace_back(alias != nullptr ? alias : "");
    self->changed.notify_all();
    return 0;
  }

  bool wait_for(const std::string& alias, std::chrono::seconds timeout) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, timeout,
                            [&] { return std::find(aliases.begin(), aliases.end(), alias) != aliases.end(); });
  }
};

// A VM named `name` of the guest image in `image` (kernel, initramfs) with command line `cmdline`, its console
// logged to `dir`/console.log and port kPortName on the socket `dir`/guest.sock.
hypervisor::testing::VmOptions guest_vm(const std::string& name, const fs::path& image, const fs::path& dir,
                                        const std::string& cmdline) {
  hypervisor::testing::VmOptions vm;
  vm.name = name + "-" + std::to_string(getpid());
  vm.memory_mib = 128;
  vm.kernel = fs::exists(image / "vmlinux") ? image / "vmlinux" : image / "vmlinuz";
  vm.initrd = image / "initramfs.cpio.gz";
  vm.cmdline = cmdline;
  vm.console_log = dir / "console.log";
  vm.channels.push_back({kPortName, dir / "guest.sock"});
  return vm;
}

}  // namespace

TEST_CASE("the guest image boots, sees hot-plugged devices, acknowledges their removal and echoes on virtio-serial",
          "[vm][guest]") {
  const auto test_start = Clock::now();
  const fs::path dir = image_dir();
  auto* daemon = vm_prerequisites(dir);
  if (daemon == nullptr) return;

  TempDir tmp;
  const auto vm =
      guest_vm("ap-guest", dir, tmp.path, std::string("console=ttyS0 quiet panic=-1 accelpool.echo=") + kPortName);
  Console console(vm.console_log);

  const auto boot_start = Clock::now();
  auto uuid = daemon->create_vm(vm);
  INFO((uuid.is_ok() ? std::string() : uuid.error().message));
  REQUIRE(uuid.is_ok());

  // 1. The guest comes up: its modules loaded and the virtio-serial port named by the host.
  auto ready = console.wait_for({"accelpool-guest: ready"}, 90s);
  const double ready_s = seconds_since(boot_start);
  INFO("console:\n" << console.tail());
  REQUIRE(ready.has_value());
  const std::string boot_log = console.text();
  CHECK(boot_log.find(std::string("accelpool-guest: port ") + kPortName + " /dev/vport") != std::string::npos);
  CHECK(boot_log.find(std::string("accelpool-guest: echo on port ") + kPortName) != std::string::npos);
  CHECK(boot_log.find("accelpool-guest: warning") == std::string::npos);
  CHECK(boot_log.find("vendor 0x1af4 device 0x1110") == std::string::npos);  // no ivshmem device yet

  // 2. Bytes written to the host end of the channel reach the guest program and come back.
  const auto echo_start = Clock::now();
  const std::string message = "accelpool echo " + std::to_string(getpid()) + " " + *uuid + "\n";
  const std::string back = echo_through(vm.channels[0].socket, message, 20s);
  const double echo_s = seconds_since(echo_start);
  CHECK(back == message);

  // 3. A hot-plugged emulated device (ivshmem-plain) shows up in the guest, twice in a row: the guest's eject
  //    acknowledgement lets the detach complete, and the slot is usable again.
  auto attacher = attacher_for(*daemon);
  const std::string device_id = daemon->unique_device_id("sim:guest");
  double plug_s[2] = {0, 0};
  double detach_s[2] = {0, 0};
  for (int round = 0; round < 2; ++round) {
    INFO("round " << round);
    const std::string lease = "lease-guest-" + std::to_string(round);
    const auto attach_start = Clock::now();
    Status attached = attacher->attach(vm.name, DeviceSpec{device_id, lease, AttachMethod::emulated, ""}).status();
    INFO((attached ? std::string() : attached.error().message));
    REQUIRE(attached.is_ok());
    auto added = console.wait_for({"accelpool-guest: pci added", "vendor 0x1af4 device 0x1110"}, 30s);
    plug_s[round] = seconds_since(attach_start);
    INFO("console:\n" << console.tail());
    REQUIRE(added.has_value());
    const std::string slot = added->substr(added->find("pci added ") + 10, 12);  // DDDD:BB:SS.F
    auto records = attacher->list_attached(vm.name);
    REQUIRE(records.is_ok());
    REQUIRE(records->size() == 1);
    const std::string alias = records->front().alias;

    const auto detach_start = Clock::now();
    auto future = attacher->detach(vm.name, device_id);
    INFO((future.is_ok() ? std::string() : future.error().message));
    REQUIRE(future.is_ok());
    REQUIRE(future->wait_for(45s) == std::future_status::ready);
    const DetachResult result = future->get();
    detach_s[round] = seconds_since(detach_start);
    INFO("detach: " << to_string(result.outcome) << ": " << result.detail);
    CHECK(result.outcome == DetachOutcome::removed);
    CHECK(result.device_free());
    CHECK_FALSE(live_has_alias(*daemon, vm.name, alias));
    CHECK(console.wait_for({"accelpool-guest: pci removed " + slot, "device 0x1110"}, 10s).has_value());
    auto recorded = attacher->list_attached(vm.name);
    REQUIRE(recorded.is_ok());
    CHECK(recorded->empty());
  }

  // 3b. Plugged again into the VM that has just released it, the moment the removal is confirmed: QEMU may not
  //     have freed the previous attachment's memory backend yet, so reusing its ids would abort QEMU ("RAMBlock
  //     ... already registered"). Every attachment has an alias of its own; each re-plug succeeds and the guest
  //     sees it.
  std::string previous_alias;
  for (int replug = 0; replug < 3; ++replug) {
    INFO("re-plug " << replug);
    const DeviceSpec spec{device_id, "lease-replug-" + std::to_string(replug), AttachMethod::emulated, ""};
    Status attached = attacher->attach(vm.name, spec).status();
    INFO((attached ? std::string() : attached.error().message));
    REQUIRE(attached.is_ok());
    auto records = attacher->list_attached(vm.name);
    REQUIRE(records.is_ok());
    REQUIRE(records->size() == 1);
    CHECK(records->front().alias != previous_alias);
    previous_alias = records->front().alias;
    INFO("console:\n" << console.tail());
    REQUIRE(console.wait_for({"accelpool-guest: pci added", "vendor 0x1af4 device 0x1110"}, 30s).has_value());
    auto future = attacher->detach(vm.name, device_id);
    REQUIRE(future.is_ok());
    REQUIRE(future->wait_for(45s) == std::future_status::ready);
    CHECK(future->get().outcome == DetachOutcome::removed);
  }

  // 4. The same with libvirt's plain calls: virDomainDetachDeviceFlags returns before the guest has answered,
  //    and the DEVICE_REMOVED event follows once it has. Events are delivered by the default event loop that
  //    the attacher above runs for the whole process.
  double raw_plug_s = 0;
  double raw_detach_s = 0;
  {
    virConnectPtr conn = virConnectOpen(daemon->uri().c_str());
    REQUIRE(conn != nullptr);
    virDomainPtr dom = virDomainLookupByName(conn, vm.name.c_str());
    REQUIRE(dom != nullptr);
    RemovedEvents events;
    const int callback =
        virConnectDomainEventRegisterAny(conn, dom, VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED,
                                         VIR_DOMAIN_EVENT_CALLBACK(RemovedEvents::on_removed), &events, nullptr);
    CHECK(callback >= 0);
    const std::string alias = "ua-guest-test-shmem";
    const std::string xml = "<shmem name='" + shmem_name(daemon->unique_device_id("guest-raw")) +
                            "'><model type='ivshmem-plain'/><size unit='M'>1</size><alias name='" + alias +
                            "'/></shmem>";
    const auto attach_start = Clock::now();
    CHECK(virDomainAttachDeviceFlags(dom, xml.c_str(), VIR_DOMAIN_AFFECT_LIVE) == 0);
    auto added = console.wait_for({"accelpool-guest: pci added", "vendor 0x1af4 device 0x1110"}, 30s);
    raw_plug_s = seconds_since(attach_start);
    INFO("console:\n" << console.tail());
    CHECK(added.has_value());
    const auto detach_start = Clock::now();
    CHECK(virDomainDetachDeviceFlags(dom, xml.c_str(), VIR_DOMAIN_AFFECT_LIVE) == 0);
    CHECK(events.wait_for(alias, 40s));
    raw_detach_s = seconds_since(detach_start);
    CHECK_FALSE(live_has_alias(*daemon, vm.name, alias));
    if (callback >= 0) virConnectDomainEventDeregisterAny(conn, callback);
    virDomainFree(dom);
    virConnectClose(conn);
  }

  CHECK(daemon->destroy_vm(vm.name).is_ok());
  const double total_s = seconds_since(test_start);
  std::printf(
      "guest VM timings (%s boot, TCG): ready %.2f s after create; echo round trip %.3f s; hot-plug seen in guest "
      "%.2f s / %.2f s / %.2f s; detach completed %.2f s / %.2f s / %.2f s (attacher, attacher, "
      "virDomainDetachDeviceFlags); whole test %.1f s\n",
      vm.kernel.filename() == "vmlinux" ? "vmlinux PVH" : "bzImage", ready_s, echo_s, plug_s[0], plug_s[1], raw_plug_s,
      detach_s[0], detach_s[1], raw_detach_s, total_s);
  std::fflush(stdout);
}

TEST_CASE("a program added to the image runs as /etc/accelpool/run and its end powers the guest off", "[vm][guest]") {
  const auto test_start = Clock::now();
  const fs::path base = image_dir();
  auto* daemon = vm_prerequisites(base);
  if (daemon == nullptr) return;

  // An image of the test's own: the run script, and a statically linked program (busybox itself) under a
  // path of its own, built from the kernel package already cached for the base image.
  TempDir tmp;
  const fs::path run = tmp.path / "run.sh";
  std::ofstream(run) << "#!/bin/sh\n"
                        "for p in /sys/class/virtio-ports/*/name; do read -r n <\"$p\"; echo \"run: port $n\"; done\n"
                        "/opt/tools/busybox echo \"run: static program says hello\"\n"
                        "exit 3\n";
  std::string release = read_file(base / "kernel.release");
  while (!release.empty() && std::isspace(static_cast<unsigned char>(release.back()))) release.pop_back();
  REQUIRE_FALSE(release.empty());
  // The same kernel package as the base image (no apt lookup), from the same cache (no download).
  const std::string build = std::string(ACCELPOOL_GUEST_BUILD_SCRIPT) + " --kernel-package linux-image-" + release +
                            " --cache " + ACCELPOOL_GUEST_CACHE_DIR + " " + (tmp.path / "image").string() + " " +
                            run.string() + ":/etc/accelpool/run /bin/busybox:/opt/tools/busybox";
  const auto build_start = Clock::now();
  auto [rc, text] = run_command(build);
  const double build_s = seconds_since(build_start);
  INFO(text);
  REQUIRE(rc == 0);
  REQUIRE_FALSE(image_unavailable(tmp.path / "image").has_value());
  {
    // Building again with the same inputs changes nothing: same bytes, same modification time.
    const fs::path initramfs = tmp.path / "image" / "initramfs.cpio.gz";
    const std::string bytes = read_file(initramfs);
    const auto mtime = fs::last_write_time(initramfs);
    auto [rc2, text2] = run_command(build);
    INFO(text2);
    CHECK(rc2 == 0);
    CHECK(fs::last_write_time(initramfs) == mtime);
    CHECK(read_file(initramfs) == bytes);
  }

  const auto vm =
      guest_vm("ap-guest-run", tmp.path / "image", tmp.path, "console=ttyS0 quiet panic=-1 accelpool.poweroff");
  Console console(vm.console_log);
  const auto boot_start = Clock::now();
  auto uuid = daemon->create_vm(vm);
  INFO((uuid.is_ok() ? std::string() : uuid.error().message));
  REQUIRE(uuid.is_ok());

  auto ended = console.wait_for({"accelpool-guest: run exited with status 3"}, 90s);
  const double run_s = seconds_since(boot_start);
  INFO("console:\n" << console.tail());
  REQUIRE(ended.has_value());
  const std::string log = console.text();
  CHECK(log.find(std::string("run: port ") + kPortName) != std::string::npos);
  CHECK(log.find("run: static program says hello") != std::string::npos);
  // The lines come in order: ready before the program's output.
  CHECK(log.find("accelpool-guest: ready") < log.find("run: port"));

  // accelpool.poweroff: the guest powers off, and the transient domain goes away.
  bool gone = false;
  const auto deadline = Clock::now() + 30s;
  while (!gone && Clock::now() < deadline) {
    gone = !daemon->live_xml(vm.name).is_ok();
    if (!gone) std::this_thread::sleep_for(100ms);
  }
  CHECK(gone);
  if (!gone) CHECK(daemon->destroy_vm(vm.name).is_ok());
  std::printf(
      "guest with /etc/accelpool/run: image built in %.1f s; program ended %.2f s after create; whole test %.1f s\n",
      build_s, run_s, seconds_since(test_start));
  std::fflush(stdout);
}

TEST_CASE("build-guest.sh --soft records why the kernel cannot be had instead of failing", "[guest-image]") {
  TempDir tmp;
  const fs::path out = tmp.path / "out";
  auto [rc, text] = run_command("ACCELPOOL_GUEST_KERNEL_PACKAGE=linux-image-0.0.0-no-such-kernel-amd64 " +
                                std::string(ACCELPOOL_GUEST_BUILD_SCRIPT) + " --soft " + out.string());
  INFO(text);
  CHECK(rc == 0);
  REQUIRE(fs::exists(out / "UNAVAILABLE"));
  CHECK(read_file(out / "UNAVAILABLE").find("linux-image-0.0.0-no-such-kernel-amd64") != std::string::npos);
  CHECK_FALSE(fs::exists(out / "initramfs.cpio.gz"));
  auto why = image_unavailable(out);
  REQUIRE(why.has_value());
  CHECK(why->find("could not be built") != std::string::npos);

  // Without --soft the same problem is an error.
  auto [rc_hard, text_hard] =
      run_command("ACCELPOOL_GUEST_KERNEL_PACKAGE=linux-image-0.0.0-no-such-kernel-amd64 " +
                  std::string(ACCELPOOL_GUEST_BUILD_SCRIPT) + " " + (tmp.path / "hard").string());
  CHECK(rc_hard != 0);
  CHECK(text_hard.find("build-guest: error: apt-get download linux-image-0.0.0-no-such-kernel-amd64 failed") !=
        std::string::npos);
}

TEST_CASE("build-guest.sh refuses bad extra files with a clear error and creates nothing", "[guest-image]") {
  TempDir tmp;
  const fs::path out = tmp.path / "out";
  const std::string script = ACCELPOOL_GUEST_BUILD_SCRIPT;

  SECTION("a dynamically linked program") {
    auto [rc, text] = run_command(script + " " + out.string() + " /bin/sh");
    CHECK(rc != 0);
    CHECK(text.find("'/bin/sh' is dynamically linked") != std::string::npos);
  }
  SECTION("a file that does not exist") {
    auto [rc, text] = run_command(script + " " + out.string() + " " + (tmp.path / "missing").string());
    CHECK(rc != 0);
    CHECK(text.find("extra file '" + (tmp.path / "missing").string() + "' does not exist") != std::string::npos);
  }
  SECTION("a relative guest path") {
    const fs::path file = tmp.path / "run.sh";
    std::ofstream(file) << "#!/bin/sh\necho hi\n";
    auto [rc, text] = run_command(script + " " + out.string() + " " + file.string() + ":etc/run");
    CHECK(rc != 0);
    CHECK(text.find("guest path 'etc/run'") != std::string::npos);
    CHECK(text.find("must be absolute") != std::string::npos);
  }
  SECTION("a file that is neither a program nor a script") {
    const fs::path file = tmp.path / "data.txt";
    std::ofstream(file) << "just text\n";
    auto [rc, text] = run_command(script + " " + out.string() + " " + file.string());
    CHECK(rc != 0);
    CHECK(text.find("is neither an ELF program nor a #! script") != std::string::npos);
  }
  CHECK_FALSE(fs::exists(out));
}

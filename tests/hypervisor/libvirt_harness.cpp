#include "libvirt_harness.hpp"

#include <accelpool/hypervisor/libvirt_xml.hpp>

#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

namespace accelpool::hypervisor::testing {

namespace fs = std::filesystem;

namespace {

std::string libvirt_message() {
  const char* m = virGetLastErrorMessage();
  return m != nullptr ? m : "unknown libvirt error";
}

void quiet(void*, virErrorPtr) {}

Status write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  if (!out) return make_error(Errc::unavailable, "cannot write " + path.string());
  return Status::ok();
}

std::string read_tail(const fs::path& path, std::size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  if (s.size() > max_bytes) s = "..." + s.substr(s.size() - max_bytes);
  return s;
}

// The daemon's configuration: its own socket, no TCP/TLS, no authentication on the (root-only) socket,
// warnings and errors to a log file in the test folder.
std::string libvirtd_conf(const fs::path& dir) {
  return "unix_sock_dir = \"" + (dir / "sock").string() +
         "\"\n"
         "unix_sock_group = \"root\"\n"
         "unix_sock_ro_perms = \"0700\"\n"
         "unix_sock_rw_perms = \"0700\"\n"
         "auth_unix_ro = \"none\"\n"
         "auth_unix_rw = \"none\"\n"
         "log_filters = \"3:*\"\n"
         "log_outputs = \"3:file:" +
         (dir / "log" / "libvirtd.log").string() + "\"\n";
}

// QEMU as root with no cgroups, per-VM mount namespace, security driver or virtlogd: a container or a small
// VM may provide none of these, and the test VMs need no isolation from the test.
const char* const kQemuConf =
    "user = \"root\"\n"
    "group = \"root\"\n"
    "dynamic_ownership = 0\n"
    "remember_owner = 0\n"
    "security_driver = \"none\"\n"
    "cgroup_controllers = [ ]\n"
    "namespaces = [ ]\n"
    "stdio_handler = \"file\"\n";

bool has_user(const char* name) { return getpwnam(name) != nullptr; }
bool has_group(const char* name) { return getgrnam(name) != nullptr; }

}  // namespace

Result<std::string> domain_xml(const VmOptions& o) {
  if (o.name.empty()) return make_error(Errc::invalid_argument, "VM name is empty");
  if (o.memory_mib == 0 || o.vcpus == 0) {
    return make_error(Errc::invalid_argument, "VM '" + o.name + "' needs memory and at least one vCPU");
  }
  if (o.kernel.empty() && (!o.initrd.empty() || !o.cmdline.empty())) {
    return make_error(Errc::invalid_argument, "VM '" + o.name + "': initrd or cmdline given without a kernel");
  }
  std::string x = "<domain type='qemu'>\n  <name>" + xml_escape(o.name) + "</name>\n  <memory unit='MiB'>" +
                  std::to_string(o.memory_mib) + "</memory>\n  <vcpu>" + std::to_string(o.vcpus) +
                  "</vcpu>\n  <os>\n    <type arch='x86_64' machine='" + xml_escape(o.machine) + "'>hvm</type>\n";
  if (!o.kernel.empty()) {
    x += "    <kernel>" + xml_escape(o.kernel.string()) + "</kernel>\n";
    if (!o.initrd.empty()) x += "    <initrd>" + xml_escape(o.initrd.string()) + "</initrd>\n";
    if (!o.cmdline.empty()) x += "    <cmdline>" + xml_escape(o.cmdline) + "</cmdline>\n";
  }
  x += "  </os>\n  <features><acpi/></features>\n"
       "  <on_poweroff>destroy</on_poweroff>\n  <on_reboot>destroy</on_reboot>\n  <on_crash>destroy</on_crash>\n"
       "  <devices>\n    <emulator>" +
       xml_escape(o.emulator.string()) + "</emulator>\n";
  if (!o.console_log.empty()) {
    x += "    <serial type='file'><source path='" + xml_escape(o.console_log.string()) +
         "'/><target port='0'/></serial>\n";
  }
  for (const auto& ch : o.channels) {
    x += "    <channel type='unix'><source mode='bind' path='" + xml_escape(ch.socket.string()) +
         "'/><target type='virtio' name='" + xml_escape(ch.name) + "'/></channel>\n";
  }
  x += "    <memballoon model='none'/>\n";
  x += o.extra_devices_xml;
  x += "  </devices>\n</domain>\n";
  return x;
}

Result<std::unique_ptr<LibvirtDaemon>> LibvirtDaemon::start(const DaemonOptions& options) {
  std::unique_ptr<LibvirtDaemon> d(new LibvirtDaemon());
  if (Status s = d->launch(options); !s) return s.error();
  return d;
}

LibvirtDaemon* LibvirtDaemon::shared(std::string* why_not) {
  static std::once_flag once;
  static std::unique_ptr<LibvirtDaemon> instance;
  static std::string error;
  std::call_once(once, [] {
    auto d = start();
    if (d) {
      instance = std::move(*d);
    } else {
      error = d.error().message;
    }
  });
  if (!instance && why_not != nullptr) *why_not = error;
  return instance.get();
}

Status LibvirtDaemon::launch(const DaemonOptions& options) {
  if (geteuid() != 0) {
    return make_error(Errc::unavailable,
                      "a private libvirtd with the QEMU driver needs root (euid is " + std::to_string(geteuid()) + ")");
  }
  for (const auto& bin : {options.libvirtd, options.emulator}) {
    if (access(bin.c_str(), X_OK) != 0) return make_error(Errc::unavailable, bin.string() + " is not installed");
  }
  char tmpl[] = "/tmp/accelpool-libvirtd-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return make_error(Errc::unavailable, std::string("mkdtemp: ") + std::strerror(errno));
  dir_ = tmpl;
  std::error_code ec;
  for (const char* sub : {"etc", "run", "lib", "log", "sock"}) fs::create_directories(dir_ / sub, ec);
  // The host side of the bind mounts (the libvirt-daemon-system package would create these).
  const std::vector<std::pair<fs::path, fs::path>> binds = {
      {dir_ / "etc", "/etc/libvirt"},
      {dir_ / "run", "/run/libvirt"},
      {dir_ / "lib", "/var/lib/libvirt"},
      {dir_ / "log", "/var/log/libvirt"},
  };
  for (const auto& [from, to] : binds) {
    fs::create_directories(to, ec);
    if (!fs::is_directory(to)) return make_error(Errc::unavailable, "cannot create " + to.string());
  }
  fs::create_directories("/var/cache/libvirt", ec);

  if (Status s = write_file(dir_ / "etc" / "libvirtd.conf", libvirtd_conf(dir_)); !s) return s;
  if (Status s = write_file(dir_ / "etc" / "qemu.conf", kQemuConf); !s) return s;

  std::vector<std::pair<fs::path, fs::path>> all_binds = binds;
  if (!has_user("libvirt-qemu") || !has_group("libvirt-qemu") || !has_group("kvm")) {
    // The QEMU driver resolves its compiled-in default user and group before it reads qemu.conf.
    fs::copy_file("/etc/passwd", dir_ / "passwd", ec);
    fs::copy_file("/etc/group", dir_ / "group", ec);
    std::ofstream passwd(dir_ / "passwd", std::ios::app);
    std::ofstream group(dir_ / "group", std::ios::app);
    if (!has_user("libvirt-qemu"))
      passwd << "libvirt-qemu:x:64055:64055:Libvirt Qemu:/var/lib/libvirt:/usr/sbin/nologin\n";
    if (!has_group("libvirt-qemu")) group << "libvirt-qemu:x:64055:\n";
    if (!has_group("kvm")) group << "kvm:x:64056:\n";
    passwd.close();
    group.close();
    if (!passwd || !group)
      return make_error(Errc::unavailable, "cannot write the private passwd/group in " + dir_.string());
    all_binds.emplace_back(dir_ / "passwd", "/etc/passwd");
    all_binds.emplace_back(dir_ / "group", "/etc/group");
  }

  uri_ = "qemu+unix:///system?socket=" + (dir_ / "sock" / "libvirt-sock").string();
  options_ = options;
  for (const auto& [from, to] : all_binds) {
    bind_from_.push_back(from.string());
    bind_to_.push_back(to.string());
  }
  return spawn();
}

Status LibvirtDaemon::spawn() {
  const fs::path socket = dir_ / "sock" / "libvirt-sock";
  // Everything the child needs is prepared before fork(): after it only async-signal-safe calls.
  const std::string conf = (dir_ / "etc" / "libvirtd.conf").string();
  const std::string pidfile = (dir_ / "run" / "libvirtd.pid").string();
  const std::string daemon = options_.libvirtd.string();
  const std::vector<std::string>& bind_from = bind_from_;
  const std::vector<std::string>& bind_to = bind_to_;
  const std::string out_path = (dir_ / "log" / "daemon.out").string();
  const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (out < 0) return make_error(Errc::unavailable, "cannot open " + out_path);
  const int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  const char* argv[] = {daemon.c_str(), "--config", conf.c_str(), "--pid-file", pidfile.c_str(), nullptr};
  const pid_t parent = getpid();

  const pid_t pid = fork();
  if (pid < 0) {
    close(out);
    return make_error(Errc::unavailable, std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    auto fail = [out](const char* what) {
      const char* err = std::strerror(errno);
      (void)!write(out, what, std::strlen(what));
      (void)!write(out, ": ", 2);
      (void)!write(out, err, std::strlen(err));
      (void)!write(out, "\n", 1);
      _exit(120);
    };
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(121);
    if (unshare(CLONE_NEWNS) != 0) fail("unshare(CLONE_NEWNS)");
    if (mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) fail("making / private");
    for (std::size_t i = 0; i < bind_from.size(); ++i) {
      if (mount(bind_from[i].c_str(), bind_to[i].c_str(), nullptr, MS_BIND, nullptr) != 0) fail(bind_to[i].c_str());
    }
    dup2(out, STDOUT_FILENO);
    dup2(out, STDERR_FILENO);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    execv(argv[0], const_cast<char* const*>(argv));
    fail("exec libvirtd");
  }
  close(out);
  if (devnull >= 0) close(devnull);
  pid_ = pid;

  virSetErrorFunc(nullptr, quiet);
  const auto deadline = std::chrono::steady_clock::now() + options_.start_timeout;
  std::string last;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return make_error(Errc::unavailable,
                        "libvirtd exited during start-up (status " + std::to_string(status) + "); log:\n" + log_tail());
    }
    if (fs::exists(socket)) {
      conn_ = virConnectOpen(uri_.c_str());
      if (conn_ != nullptr) {
        unsigned long version = 0;
        if (virConnectGetVersion(conn_, &version) == 0) return Status::ok();
        last = libvirt_message();
        virConnectClose(conn_);
        conn_ = nullptr;
      } else {
        last = libvirt_message();
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return make_error(Errc::unavailable, "libvirtd did not answer at " + uri_ + " within " +
                                           std::to_string(options_.start_timeout.count()) + " s (" + last +
                                           "); log:\n" + log_tail());
}

LibvirtDaemon::~LibvirtDaemon() { stop(); }

namespace {

// The QEMU process of a running VM, from the pid file libvirt keeps in its (private) runtime folder.
pid_t qemu_pid(const fs::path& pidfile) {
  std::ifstream in(pidfile);
  long pid = 0;
  if (!(in >> pid) || pid <= 1) return -1;
  return static_cast<pid_t>(pid);
}

}  // namespace

void LibvirtDaemon::stop_daemon() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  int status = 0;
  bool gone = false;
  for (int i = 0; i < 60 && !gone; ++i) {
    gone = waitpid(pid_, &status, WNOHANG) == pid_;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!gone) {
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
  }
  pid_ = -1;
}

Status LibvirtDaemon::restart() {
  if (conn_ != nullptr) {
    virConnectClose(conn_);
    conn_ = nullptr;
  }
  stop_daemon();
  std::error_code ec;
  fs::remove(dir_ / "sock" / "libvirt-sock", ec);
  return spawn();
}

void LibvirtDaemon::stop() {
  if (conn_ != nullptr) {
    virConnectClose(conn_);
    conn_ = nullptr;
  }
  std::error_code ec;
  // QEMU processes outlive libvirtd by design. SIGKILL ends them at once (virDomainDestroy takes ~2 s per VM
  // under TCG); the daemon and its state go away right after.
  if (!dir_.empty()) {
    for (const auto& entry : fs::directory_iterator(dir_ / "run" / "qemu", ec)) {
      if (entry.path().extension() != ".pid") continue;
      if (pid_t pid = qemu_pid(entry.path()); pid > 0) kill(pid, SIGKILL);
    }
  }
  stop_daemon();
  if (dir_.empty()) return;
  const std::string suffix = escape_device_id("@" + std::to_string(getpid()));
  for (const auto& entry : fs::directory_iterator("/dev/shm", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("accelpool-", 0) == 0 && name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      fs::remove(entry.path(), ec);
    }
  }
  const char* keep = std::getenv("ACCELPOOL_KEEP_LIBVIRTD_DIR");
  if (keep == nullptr || std::string(keep) != "1") fs::remove_all(dir_, ec);
}

std::string LibvirtDaemon::log_tail(std::size_t max_bytes) const {
  std::string out = read_tail(dir_ / "log" / "daemon.out", max_bytes / 3);
  std::string log = read_tail(dir_ / "log" / "libvirtd.log", max_bytes);
  if (!out.empty()) out += "\n";
  return out + log;
}

Result<std::string> LibvirtDaemon::create_vm(const VmOptions& options) {
  auto xml = domain_xml(options);
  if (!xml) return xml.error();
  virDomainPtr d = virDomainCreateXML(conn_, xml->c_str(), 0);
  if (d == nullptr) {
    return make_error(Errc::hypervisor, "creating VM '" + options.name + "': " + libvirt_message() + "\nQEMU log:\n" +
                                            read_tail(dir_ / "log" / "qemu" / (options.name + ".log"), 2000));
  }
  char uuid[VIR_UUID_STRING_BUFLEN] = {};
  virDomainGetUUIDString(d, uuid);
  virDomainFree(d);
  return std::string(uuid);
}

Status LibvirtDaemon::destroy_vm(const std::string& name) {
  virDomainPtr d = virDomainLookupByName(conn_, name.c_str());
  if (d == nullptr) return make_error(Errc::not_found, "no VM '" + name + "': " + libvirt_message());
  const int rc = virDomainDestroy(d);
  std::string message = rc < 0 ? libvirt_message() : "";
  virDomainFree(d);
  if (rc < 0) return make_error(Errc::hypervisor, "destroying VM '" + name + "': " + message);
  return Status::ok();
}

Status LibvirtDaemon::kill_vm(const std::string& name) {
  const fs::path pidfile = dir_ / "run" / "qemu" / (name + ".pid");
  const pid_t pid = qemu_pid(pidfile);
  if (pid <= 0) return make_error(Errc::not_found, "no running VM '" + name + "' (no pid in " + pidfile.string() + ")");
  if (kill(pid, SIGKILL) != 0) {
    return make_error(Errc::hypervisor, "killing QEMU of VM '" + name + "': " + std::strerror(errno));
  }
  return Status::ok();
}

Status LibvirtDaemon::set_metadata(const std::string& name, const std::string& ns_uri, const std::string& key,
                                   const std::string& xml) {
  virDomainPtr d = virDomainLookupByName(conn_, name.c_str());
  if (d == nullptr) return make_error(Errc::not_found, "no VM '" + name + "': " + libvirt_message());
  const int rc = virDomainSetMetadata(d, VIR_DOMAIN_METADATA_ELEMENT, xml.empty() ? nullptr : xml.c_str(),
                                      xml.empty() ? nullptr : key.c_str(), ns_uri.c_str(), VIR_DOMAIN_AFFECT_LIVE);
  std::string message = rc < 0 ? libvirt_message() : "";
  virDomainFree(d);
  if (rc < 0) return make_error(Errc::hypervisor, "setting metadata of VM '" + name + "': " + message);
  return Status::ok();
}

Result<std::string> LibvirtDaemon::live_xml(const std::string& name) {
  virDomainPtr d = virDomainLookupByName(conn_, name.c_str());
  if (d == nullptr) return make_error(Errc::not_found, "no VM '" + name + "': " + libvirt_message());
  char* xml = virDomainGetXMLDesc(d, 0);
  std::string message = xml == nullptr ? libvirt_message() : "";
  virDomainFree(d);
  if (xml == nullptr) return make_error(Errc::hypervisor, "reading VM '" + name + "': " + message);
  std::string out(xml);
  std::free(xml);
  return out;
}

Status LibvirtDaemon::attach_device(const std::string& name, const std::string& xml) {
  virDomainPtr d = virDomainLookupByName(conn_, name.c_str());
  if (d == nullptr) return make_error(Errc::not_found, "no VM '" + name + "': " + libvirt_message());
  const int rc = virDomainAttachDeviceFlags(d, xml.c_str(), VIR_DOMAIN_AFFECT_LIVE);
  std::string message = rc < 0 ? libvirt_message() : "";
  virDomainFree(d);
  if (rc < 0) return make_error(Errc::hypervisor, "attaching a device to VM '" + name + "': " + message);
  return Status::ok();
}

std::string LibvirtDaemon::unique_device_id(const std::string& base) const {
  return base + "@" + std::to_string(getpid());
}

}  // namespace accelpool::hypervisor::testing

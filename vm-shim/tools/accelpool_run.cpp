// accelpool-run: acquire devices, run a command with them, give them back. See docs/guest-guide.md.
#include "run_environment.hpp"

#include <accelpool/common/cli.hpp>
#include <accelpool/shim/client.hpp>
#include <accelpool/shim/transport.hpp>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <optional>
#include <string>
#include <vector>

extern char** environ;

namespace {

using namespace accelpool::shim;
using accelpool::Errc;

constexpr const char* kDescription = R"(accelpool-run: run a command with devices of an accelpool pool:
accelpool-run [options] -- command [args...]

Acquires devices from an accelpool pool, runs the command with them (environment variables
ACCELPOOL_LEASE, ACCELPOOL_DEVICES, ACCELPOOL_KIND, ... describe the grant; CUDA_VISIBLE_DEVICES,
ROCR_VISIBLE_DEVICES, ZE_AFFINITY_MASK and POCL_DEVICES, where they apply, show vendor runtimes
only the granted devices), forwards signals to it,
sends it SIGTERM when the lease is being revoked (SIGKILL if it still runs at the revocation deadline),
releases the lease when it ends, and exits with the command's status (128+N if it was killed by signal N).

Exit status: the command's; 2 bad usage, 3 pool unreachable, 4 token refused, 5 request infeasible
(or over quota), 6 not granted within --timeout, 1 other failures before the command ran,
126 command not executable, 127 command not found.
)";

std::atomic<bool> g_revoking{false};
std::atomic<bool> g_ended{false};
std::atomic<double> g_deadline{0};

// Seconds since the Unix epoch, as the pool's times (revoke_deadline) are.
double wall_clock() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

int fail_usage(const std::string& msg) {
  std::fprintf(stderr, "accelpool-run: %s\n(see accelpool-run --help)\n", msg.c_str());
  return 2;
}

int exit_code_for(Errc code) {
  if (code == Errc::invalid_argument || code == Errc::unsupported_version) return 2;
  if (code == Errc::unreachable || code == Errc::disconnected) return 3;
  if (code == Errc::unauthorized) return 4;
  if (code == Errc::infeasible || code == Errc::quota_exceeded) return 5;
  if (code == Errc::timeout) return 6;
  return 1;
}

bool parse_number(const std::string& s, double& out) {
  char* end = nullptr;
  errno = 0;
  out = std::strtod(s.c_str(), &end);
  return errno == 0 && end && *end == '\0' && !s.empty() && out >= 0;
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  ClientOptions copts;
  copts.uri = default_pool_uri();
  copts.token = env_or("ACCELPOOL_TOKEN", "");
  copts.guest = env_or("ACCELPOOL_GUEST", "");
  AcquireOptions aopts;
  aopts.kind = "fpga";
  bool verbose = false;
  std::string count = "1", estimate, timeout, label;
  std::vector<std::string> command;
  CLI::App app{kDescription};
  accelpool::common::init_cli(app, "accelpool-run");
  app.add_option("--pool", copts.uri,
                 "tcp://HOST:PORT, tls://HOST:PORT, unix:///PATH or serial://NAME (env ACCELPOOL_POOL; default: the "
                 "guest daemon's "
                 "unix:///run/accelpool/guest.sock when it exists, else tcp://127.0.0.1:7070)")
      ->type_name("URI");
  app.add_option("--token", copts.token, "tenant token (env ACCELPOOL_TOKEN)");
  app.add_option("--ca-file", copts.tls_ca_file,
                 "tls:// pools: the PEM CA file that verifies the pool's certificate (env ACCELPOOL_POOL_CA; default: "
                 "the system's CAs)")
      ->type_name("PATH");
  app.add_option("--guest", copts.guest, "guest id (env ACCELPOOL_GUEST, default: the host name)")->type_name("ID");
  app.add_option("--kind", aopts.kind, "device kind (default fpga)")->type_name("K");
  app.add_option("--bitstream", aopts.bitstream, "bitstream the devices must hold")->type_name("B");
  app.add_option("--count", count, "number of devices, all or nothing (default 1)")->type_name("N");
  app.add_option("--estimate", estimate, "expected run time (helps shortest-job policies)")->type_name("SECONDS");
  auto* label_option =
      app.add_option(
             "--label", label,
             "the job's name: the pool learns run times per label (default: the command's file name when it is 1-64 "
             "characters of [A-Za-z0-9._:-]; --label '' sends none)")
          ->type_name("NAME");
  app.add_option("--timeout", timeout, "give up if not granted within this (default: wait)")->type_name("SECONDS");
  app.add_flag("-v,--verbose", verbose,
               "say what was granted and released, and why a vendor variable was not set, on stderr");
  app.add_option("command", command, "the command and its arguments, after --")->type_name("COMMAND...");
  if (auto rc = accelpool::common::parse_cli(app, argc, argv)) return *rc;
  if (aopts.kind.empty()) return fail_usage("--kind must not be empty");
  double n;
  if (!parse_number(count, n) || n < 1 || n > 4096 || n != static_cast<std::uint32_t>(n)) {
    return fail_usage("--count '" + count + "' must be a whole number in 1..4096");
  }
  aopts.count = static_cast<std::uint32_t>(n);
  if (!estimate.empty()) {
    double s;
    if (!parse_number(estimate, s)) return fail_usage("--estimate '" + estimate + "' must be a number of seconds >= 0");
    aopts.estimate_s = s;
  }
  if (!timeout.empty()) {
    double s;
    if (!parse_number(timeout, s)) return fail_usage("--timeout '" + timeout + "' must be a number of seconds >= 0");
    aopts.timeout = Seconds(s);
  }
  std::vector<char*> command_argv;
  for (auto& word : command) command_argv.push_back(word.data());
  command_argv.push_back(nullptr);
  if (command.empty()) return fail_usage("no command given after '--'");
  if (copts.token.empty()) return fail_usage("no token: pass --token or set ACCELPOOL_TOKEN");
  if (label_option->count() > 0) {
    aopts.label = label;  // checked by the manager
  } else {
    std::string name = command.front().substr(command.front().rfind('/') + 1);
    const bool usable = !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' || c == '-';
    });
    if (usable) aopts.label = name;
  }

  // Signals are taken synchronously by the main loop; every thread started from here on inherits the mask.
  sigset_t handled, original;
  sigemptyset(&handled);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD, SIGUSR1}) sigaddset(&handled, s);
  pthread_sigmask(SIG_BLOCK, &handled, &original);

  auto client = Client::connect(copts);
  if (!client) {
    std::fprintf(stderr, "accelpool-run: %s\n", client.error().message.c_str());
    return exit_code_for(client.error().code);
  }
  pid_t self = getpid();
  aopts.on_revoking = [self](const LeaseInfo& l) {
    g_deadline = l.revoke_deadline.value_or(0);
    g_revoking = true;
    kill(self, SIGUSR1);
  };
  aopts.on_ended = [self](const LeaseInfo&) {
    g_ended = true;
    kill(self, SIGUSR1);
  };
  // A signal while waiting for the grant gives the request up.
  auto pending = (*client)->acquire_async(aopts);
  std::optional<Lease> lease;
  while (!lease) {
    auto r = pending.wait(Seconds(0.1));
    // This wait's slice ran out, but the request may have finished right after it (granted, or its own
    // --timeout passed): then the next wait returns that outcome at once.
    if (!r && r.error().code == Errc::timeout && pending.done()) r = pending.wait(Seconds(0));
    if (r) {
      lease = std::move(*r);
      break;
    }
    if (r.error().code != Errc::timeout || pending.done()) {
      std::fprintf(stderr, "accelpool-run: %s\n", r.error().message.c_str());
      return exit_code_for(r.error().code);
    }
    timespec zero{0, 0};
    siginfo_t si;
    int sig = sigtimedwait(&handled, &si, &zero);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT) {
      (void)pending.cancel();
      std::fprintf(stderr, "accelpool-run: interrupted by signal %d while waiting; request cancelled\n", sig);
      return 128 + sig;
    }
  }
  LeaseInfo info = lease->info();
  if (verbose) {
    std::string devs;
    for (const auto& d : info.devices) devs += " " + d.name;
    std::fprintf(stderr, "accelpool-run: lease %llu granted:%s\n", static_cast<unsigned long long>(info.id),
                 devs.c_str());
  }

  // The command's environment: ours plus the grant's, prepared before fork (the child only execs).
  run::CommandEnvironment grant_env =
      run::lease_environment(info, copts.uri, copts.tls_ca_file, copts.guest.empty() ? info.guest : copts.guest);
  if (verbose) {
    for (const auto& note : grant_env.notes) std::fprintf(stderr, "accelpool-run: %s\n", note.c_str());
  }
  const std::vector<std::string>& vars = grant_env.variables;
  std::vector<std::string> merged;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    std::string k = kv.substr(0, kv.find('='));
    bool replaced = std::any_of(vars.begin(), vars.end(),
                                [&](const std::string& v) { return v.compare(0, k.size() + 1, k + "=") == 0; });
    if (!replaced) merged.push_back(kv);
  }
  merged.insert(merged.end(), vars.begin(), vars.end());
  std::vector<char*> envp;
  for (auto& s : merged) envp.push_back(s.data());
  envp.push_back(nullptr);

  int errpipe[2];
  if (pipe2(errpipe, O_CLOEXEC) != 0) {
    std::fprintf(stderr, "accelpool-run: pipe: %s\n", std::strerror(errno));
    return 1;
  }
  pid_t child = fork();
  if (child < 0) {
    std::fprintf(stderr, "accelpool-run: fork: %s\n", std::strerror(errno));
    return 1;
  }
  if (child == 0) {
    ::close(errpipe[0]);
    sigprocmask(SIG_SETMASK, &original, nullptr);
    execvpe(command_argv[0], command_argv.data(), envp.data());
    int err = errno;
    [[maybe_unused]] ssize_t n = ::write(errpipe[1], &err, sizeof err);
    _exit(err == ENOENT ? 127 : 126);
  }
  ::close(errpipe[1]);
  int exec_errno = 0;
  if (::read(errpipe[0], &exec_errno, sizeof exec_errno) == static_cast<ssize_t>(sizeof exec_errno)) {
    std::fprintf(stderr, "accelpool-run: cannot run '%s': %s\n", command_argv[0], std::strerror(exec_errno));
  }
  ::close(errpipe[0]);

  int status = 0;
  bool term_sent = false;
  bool kill_sent = false;
  for (;;) {
    if ((g_revoking || g_ended) && !term_sent) {
      term_sent = true;
      if (verbose || g_revoking) {
        std::fprintf(stderr, "accelpool-run: lease %llu is %s; sending SIGTERM to the command\n",
                     static_cast<unsigned long long>(info.id), g_ended ? "ended" : "being revoked");
      }
      kill(child, SIGTERM);
    }
    // The devices go back to the pool at the revocation deadline whatever the command does: a command that
    // outlives it would use devices that are no longer its own.
    if (g_revoking && !kill_sent && g_deadline > 0 && wall_clock() >= g_deadline) {
      kill_sent = true;
      std::fprintf(stderr,
                   "accelpool-run: lease %llu reached its revocation deadline; sending SIGKILL to the command\n",
                   static_cast<unsigned long long>(info.id));
      kill(child, SIGKILL);
    }
    pid_t w = waitpid(child, &status, WNOHANG);
    if (w == child) break;
    timespec tick{0, 200 * 1000 * 1000};
    siginfo_t si;
    int sig = sigtimedwait(&handled, &si, &tick);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT) {
      // A terminal's signal (SI_KERNEL) already reached the command in our process group; one sent to us alone
      // (kill, a supervisor) is passed on.
      if (si.si_code != SI_KERNEL) kill(child, sig);
    }
  }
  auto released = lease->release();
  if (!released)
    std::fprintf(stderr, "accelpool-run: releasing lease %llu: %s\n", static_cast<unsigned long long>(info.id),
                 released.error().message.c_str());
  else if (verbose)
    std::fprintf(stderr, "accelpool-run: lease %llu released\n", static_cast<unsigned long long>(info.id));
  lease.reset();
  client->reset();
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

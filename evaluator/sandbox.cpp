#include "sandbox.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace opforge::evaluator {

namespace {

bool write_proc(const char* file, const std::string& text) {
  int fd = ::open(file, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  return ok;
}

// A bind mount remounted read-only must keep the flags the kernel locked on the original
// (nosuid, nodev, noexec, atime) or an unprivileged remount is refused.
unsigned long locked_flags(const std::string& path) {
  struct statvfs st {};
  if (::statvfs(path.c_str(), &st) != 0) return 0;
  unsigned long f = 0;
  if (st.f_flag & ST_NOSUID) f |= MS_NOSUID;
  if (st.f_flag & ST_NODEV) f |= MS_NODEV;
  if (st.f_flag & ST_NOEXEC) f |= MS_NOEXEC;
  if (st.f_flag & ST_NOATIME) f |= MS_NOATIME;
  if (st.f_flag & ST_NODIRATIME) f |= MS_NODIRATIME;
  if (st.f_flag & ST_RELATIME) f |= MS_RELATIME;
  return f;
}

void note(const std::string& text) {
  // The worker's stderr goes to the pool's log; the interpreter is not up yet.
  std::fprintf(stderr, "[sandbox] %s\n", text.c_str());
}

}  // namespace

std::string enter_sandbox_from_env() {
  const char* want = std::getenv("OPFORGE_SANDBOX");
  if (!want || std::string(want) != "1") return "off";
  uid_t uid = ::getuid();
  gid_t gid = ::getgid();
  std::string state;
  // A user namespace lets an unprivileged process own a network namespace (empty: not even
  // loopback is up) and a mount namespace (private read-only bind mounts).
  if (::unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWNS) != 0) {
    state = fmt::format("off: unshare(CLONE_NEWUSER|CLONE_NEWNET|CLONE_NEWNS) refused: {}", std::strerror(errno));
    note(state + "; the solution runs with the network and a writable harness");
    ::setenv("OPFORGE_SANDBOX_STATE", state.c_str(), 1);
    return state;
  }
  // Keep our own ids inside the namespace, so files keep their owners.
  write_proc("/proc/self/setgroups", "deny");
  if (!write_proc("/proc/self/uid_map", fmt::format("{} {} 1", uid, uid)) ||
      !write_proc("/proc/self/gid_map", fmt::format("{} {} 1", gid, gid)))
    note(fmt::format("could not map uid/gid into the user namespace: {}", std::strerror(errno)));
  state = "net";
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    note(fmt::format("mount namespace not private ({}): the harness stays writable", std::strerror(errno)));
  } else {
    const char* ro = std::getenv("OPFORGE_SANDBOX_RO");
    std::stringstream ss(ro ? ro : "");
    int done = 0, failed = 0;
    for (std::string p; std::getline(ss, p, ':');) {
      if (p.empty() || !std::filesystem::exists(p)) continue;
      std::error_code ec;
      std::string real = std::filesystem::canonical(p, ec).string();
      if (ec) continue;
      if (::mount(real.c_str(), real.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0 ||
          ::mount(nullptr, real.c_str(), nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY | locked_flags(real), nullptr) != 0) {
        note(fmt::format("could not make {} read-only: {}", real, std::strerror(errno)));
        ++failed;
      } else {
        ++done;
      }
    }
    if (done > 0 && failed == 0) state += ",ro";
  }
  ::setenv("OPFORGE_SANDBOX_STATE", state.c_str(), 1);
  return state;
}

}  // namespace opforge::evaluator

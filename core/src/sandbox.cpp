#include "opforge/core/sandbox.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "opforge/core/error.h"

extern char** environ;

namespace fs = std::filesystem;
using nlohmann::json;

namespace opforge {

// ---------------------------------------------------------------------------------------------
// The spec and its JSON form.

namespace {

constexpr const char* kKeys[] = {"ro", "rw", "work", "gpu", "env", "memory_mb", "max_pids", "cwd", "keep_fds"};

std::string shown(const json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

[[noreturn]] void bad_type(const std::string& key, const char* want, const json& got) {
  throw Error(fmt::format("sandbox spec: \"{}\" must be {} (got {})", key, want, shown(got)));
}

std::string string_at(const json& v, const std::string& key) {
  if (!v.is_string()) bad_type(key, "a string", v);
  return v.get<std::string>();
}

std::vector<std::string> strings_at(const json& v, const std::string& key) {
  if (!v.is_array()) bad_type(key, "an array of path strings", v);
  std::vector<std::string> out;
  for (std::size_t i = 0; i < v.size(); ++i) out.push_back(string_at(v[i], fmt::format("{}[{}]", key, i)));
  return out;
}

std::size_t count_at(const json& v, const std::string& key) {
  // Integers written by C++ (a vector<int>) are signed in nlohmann::json, parsed ones unsigned.
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<long long>() < 0))
    bad_type(key, "a non-negative integer", v);
  return v.get<std::size_t>();
}

bool is_under(const std::string& path, const std::string& dir) {
  if (dir == "/") return true;
  return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && path[dir.size()] == '/');
}

void check_place(const std::string& key, const std::string& p) {
  OPFORGE_CHECK(!p.empty() && p[0] == '/', "sandbox spec: \"{}\" paths must be absolute (got \"{}\")", key, p);
  OPFORGE_CHECK(fs::path(p).lexically_normal().string() == p || fs::path(p).lexically_normal().string() + "/" == p,
                "sandbox spec: \"{}\" path \"{}\" is not normalized (no '.', '..' or '//')", key, p);
  OPFORGE_CHECK(p != "/", "sandbox spec: \"{}\" cannot bind the whole root \"/\"", key);
  OPFORGE_CHECK(!is_under(p, "/proc") && !is_under(p, "/dev"),
                "sandbox spec: \"{}\" path \"{}\": /proc and /dev are the sandbox's own (use \"gpu\" for devices)", key, p);
  OPFORGE_CHECK(p != "/work", "sandbox spec: \"{}\" path \"/work\": use \"work\" to bind a host folder there", key);
}

std::string strip_slash(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

}  // namespace

void to_json(json& j, const SandboxSpec& s) {
  j = json{{"ro", s.ro},   {"rw", s.rw},         {"work", s.work},         {"gpu", s.gpu},
           {"env", s.env}, {"memory_mb", s.memory_mb}, {"max_pids", s.max_pids}, {"cwd", s.cwd},
           {"keep_fds", s.keep_fds}};
}

void from_json(const json& j, SandboxSpec& s) {
  OPFORGE_CHECK(j.is_object(), "sandbox spec: must be a JSON object (got {})", shown(j));
  for (auto& [key, v] : j.items()) {
    if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys))
      throw Error(fmt::format("sandbox spec: unknown key \"{}\" (known: {})", key, fmt::join(kKeys, ", ")));
    if (key == "ro") s.ro = strings_at(v, key);
    if (key == "rw") s.rw = strings_at(v, key);
    if (key == "work") s.work = string_at(v, key);
    if (key == "cwd") s.cwd = string_at(v, key);
    if (key == "memory_mb") s.memory_mb = count_at(v, key);
    if (key == "max_pids") s.max_pids = count_at(v, key);
    if (key == "gpu") {
      if (!v.is_boolean()) bad_type(key, "true or false", v);
      s.gpu = v.get<bool>();
    }
    if (key == "env") {
      if (!v.is_object()) bad_type(key, "an object of strings", v);
      s.env.clear();
      for (auto& [k, val] : v.items()) s.env[k] = string_at(val, "env." + k);
    }
    if (key == "keep_fds") {
      if (!v.is_array()) bad_type(key, "an array of fd numbers", v);
      s.keep_fds.clear();
      for (std::size_t i = 0; i < v.size(); ++i)
        s.keep_fds.push_back(static_cast<int>(count_at(v[i], fmt::format("keep_fds[{}]", i))));
    }
  }
  for (auto& p : s.ro) p = strip_slash(p);
  for (auto& p : s.rw) p = strip_slash(p);
  s.work = strip_slash(s.work);
  validate(s);
}

void validate(const SandboxSpec& s) {
  std::set<std::string> ro(s.ro.begin(), s.ro.end());
  for (auto& p : s.ro) check_place("ro", p);
  for (auto& p : s.rw) {
    check_place("rw", p);
    OPFORGE_CHECK(!ro.count(p), "sandbox spec: \"{}\" is listed in both \"ro\" and \"rw\"", p);
  }
  if (!s.work.empty())
    OPFORGE_CHECK(s.work[0] == '/', "sandbox spec: \"work\" must be an absolute path (got \"{}\")", s.work);
  OPFORGE_CHECK(!s.cwd.empty() && s.cwd[0] == '/', "sandbox spec: \"cwd\" must be an absolute path (got \"{}\")", s.cwd);
  for (auto& [k, v] : s.env) {
    OPFORGE_CHECK(!k.empty() && k.find('=') == std::string::npos && k.find('\0') == std::string::npos,
                  "sandbox spec: \"env\" has an invalid variable name \"{}\"", k);
    OPFORGE_CHECK(v.find('\0') == std::string::npos, "sandbox spec: \"env.{}\" contains a NUL character", k);
  }
  for (int fd : s.keep_fds)
    OPFORGE_CHECK(fd >= 3, "sandbox spec: \"keep_fds\" lists fd {}; fds 0-2 are always inherited", fd);
  OPFORGE_CHECK(s.max_pids == 0 || s.max_pids >= 3,
                "sandbox spec: \"max_pids\" {} leaves no room for the command (bwrap itself takes 2)", s.max_pids);
}

// ---------------------------------------------------------------------------------------------
// The bwrap command line.

namespace {

void add(std::vector<std::string>& a, std::initializer_list<std::string> items) { a.insert(a.end(), items); }

// The sandbox's uid maps to its launcher's; for a root launcher, root-only files would then be
// readable inside, so /etc's secrets (shadow, private keys) are hidden: files behind /dev/null
// (unopenable: nodev), folders behind an empty read-only tmpfs.
void add_etc_masks(std::vector<std::string>& a) {
  std::error_code ec;
  fs::recursive_directory_iterator it("/etc", fs::directory_options::skip_permission_denied, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode) && (st.st_mode & (S_IROTH | S_IXOTH)) != (S_IROTH | S_IXOTH)) {
      add(a, {"--tmpfs", it->path().string(), "--remount-ro", it->path().string()});
      it.disable_recursion_pending();
    } else if (S_ISREG(st.st_mode) && !(st.st_mode & S_IROTH)) {
      add(a, {"--ro-bind", "/dev/null", it->path().string()});
    }
  }
}

void add_system_root(std::vector<std::string>& a) {
  for (const char* d : {"/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/etc"}) {
    std::error_code ec;
    auto st = fs::symlink_status(d, ec);
    if (ec) continue;
    if (fs::is_symlink(st))  // merged /usr: /bin -> usr/bin
      add(a, {"--symlink", fs::read_symlink(d, ec).string(), d});
    else if (fs::is_directory(st))
      add(a, {"--ro-bind", d, d});
  }
  add_etc_masks(a);
}

void add_gpu(std::vector<std::string>& a) {
  std::vector<std::string> devices;
  std::error_code ec;
  for (auto& e : fs::directory_iterator("/dev", ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind("nvidia", 0) == 0 && name != "nvidia-caps") devices.push_back(e.path().string());
  }
  std::sort(devices.begin(), devices.end());
  for (auto& d : devices) add(a, {"--dev-bind", d, d});
  add(a, {"--dev-bind-try", "/dev/nvidia-caps", "/dev/nvidia-caps", "--ro-bind-try", "/proc/driver/nvidia",
          "/proc/driver/nvidia"});
}

// --disable-userns is bwrap 0.8.0's; older ones refuse the option.
bool can_disable_userns(const std::string& version) {
  int major = 0, minor = 0;
  return std::sscanf(version.c_str(), "%d.%d", &major, &minor) == 2 && (major > 0 || minor >= 8);
}

struct Place {
  std::string op, src, dst;
};

// The writable places and the spec's binds, parents before children whatever the spec's order.
std::vector<Place> places(const SandboxSpec& s) {
  std::vector<Place> p = {{"--tmpfs", "", "/tmp"}, {"--tmpfs", "", "/home"}};
  p.push_back(s.work.empty() ? Place{"--tmpfs", "", "/work"} : Place{"--bind", s.work, "/work"});
  auto writable = [](const std::string& d) { return is_under(d, "/tmp") || is_under(d, "/home") || is_under(d, "/work"); };
  // HOME and cwd must exist: made inside a writable place, else HOME gets a tmpfs of its own.
  if (auto h = s.env.find("HOME"); h != s.env.end() && !h->second.empty() && h->second[0] == '/') {
    std::string home = strip_slash(h->second);
    if (home != "/tmp" && home != "/home" && home != "/work")
      p.push_back(writable(home) ? Place{"--dir", "", home} : Place{"--tmpfs", "", home});
  }
  if (s.cwd != "/tmp" && s.cwd != "/home" && s.cwd != "/work" && writable(s.cwd)) p.push_back({"--dir", "", s.cwd});
  for (auto& r : s.ro) p.push_back({"--ro-bind", r, r});
  for (auto& r : s.rw) p.push_back({"--bind", r, r});
  auto depth = [](const std::string& d) { return std::count(d.begin(), d.end(), '/'); };
  std::stable_sort(p.begin(), p.end(), [&](const Place& x, const Place& y) { return depth(x.dst) < depth(y.dst); });
  return p;
}

}  // namespace

std::vector<std::string> bwrap_argv(const SandboxSpec& spec, const std::vector<std::string>& command) {
  validate(spec);
  OPFORGE_CHECK(!command.empty(), "sandbox: no command to run");
  // --unshare-all only tries the user namespace; --unshare-user makes it a requirement.
  std::vector<std::string> a = {"bwrap",           "--unshare-all", "--unshare-user", "--uid",        "65534",
                                "--gid",           "65534",         "--hostname",     "sandbox",      "--die-with-parent",
                                "--new-session",   "--cap-drop",    "ALL",            "--clearenv"};
  // No nested user namespaces: each would be a fresh root-in-namespace for kernel bugs to meet.
  if (can_disable_userns(bwrap_version(find_bwrap()))) add(a, {"--disable-userns"});
  for (auto& [k, v] : spec.env) add(a, {"--setenv", k, v});
  add_system_root(a);
  add(a, {"--proc", "/proc", "--dev", "/dev"});
  if (spec.gpu) add_gpu(a);
  for (auto& pl : places(spec)) {
    a.push_back(pl.op);
    if (!pl.src.empty()) a.push_back(pl.src);
    a.push_back(pl.dst);
  }
  // Last: the root tmpfs holding the mount points becomes read-only too.
  add(a, {"--remount-ro", "/", "--chdir", spec.cwd, "--"});
  a.insert(a.end(), command.begin(), command.end());
  return a;
}

// ---------------------------------------------------------------------------------------------
// Finding bwrap.

namespace {

std::string bwrap_missing() {
  if (const char* e = std::getenv("OPFORGE_BWRAP"); e && *e)
    return fmt::format("OPFORGE_BWRAP={} is not an executable file", e);
  return "bwrap not found on PATH: apt-get install bubblewrap (or set OPFORGE_BWRAP to its path)";
}

bool executable_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
}

// Runs argv (no shell), returns its stdout; empty when it cannot run or fails.
std::string capture(const std::vector<std::string>& args) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return "";
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, p[1], 1);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(p[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; rc == 0 && (n = ::read(p[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(p[0]);
  int status = 0;
  if (rc == 0) while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  return rc == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? out : "";
}

}  // namespace

std::string find_bwrap() {
  if (const char* e = std::getenv("OPFORGE_BWRAP"); e && *e) return executable_file(e) ? e : "";
  const char* path = std::getenv("PATH");
  std::stringstream ss(path && *path ? path : "/usr/local/bin:/usr/bin:/bin");
  for (std::string dir; std::getline(ss, dir, ':');) {
    std::string c = (dir.empty() ? std::string(".") : dir) + "/bwrap";
    if (executable_file(c)) return c;
  }
  return "";
}

std::string bwrap_version(const std::string& bwrap) {
  static std::mutex mu;
  static std::map<std::string, std::string> cache;
  std::lock_guard lock(mu);
  if (auto it = cache.find(bwrap); it != cache.end()) return it->second;
  std::string out = bwrap.empty() ? "" : capture({bwrap, "--version"});  // "bubblewrap 0.8.0\n"
  while (!out.empty() && std::isspace(static_cast<unsigned char>(out.back()))) out.pop_back();
  std::string v = out.substr(out.rfind(' ') == std::string::npos ? 0 : out.rfind(' ') + 1);
  return cache[bwrap] = v;
}

std::string describe(const SandboxSpec& spec, const Limits& applied) {
  std::string version = bwrap_version(find_bwrap());
  std::string limits;
  if (applied.mechanism == "none") {
    limits = fmt::format("none ({})", applied.why.empty() ? "not set up" : applied.why);
  } else {
    auto mem = applied.memory_mb ? fmt::format("{}M", applied.memory_mb) : std::string("unlimited");
    auto pids = applied.max_pids ? std::to_string(applied.max_pids) : std::string("unlimited");
    limits = fmt::format("{} memory={} pids={}", applied.mechanism, mem, pids);
  }
  return fmt::format("bwrap {}: ro-root, net none, pid/ipc/uts ns, uid nobody, caps dropped, no_new_privs{}, env {} "
                     "vars{}; limits {}",
                     version.empty() ? "(not found)" : version, can_disable_userns(version) ? ", no nested userns" : "",
                     spec.env.size(), spec.gpu ? ", gpu" : "", limits);
}

// ---------------------------------------------------------------------------------------------
// Cgroups: one per launch, removed afterwards.

namespace {

bool write_text(const fs::path& p, const std::string& text, int* err = nullptr) {
  int fd = ::open(p.c_str(), O_WRONLY | O_CLOEXEC);
  bool ok = fd >= 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  if (err) *err = ok ? 0 : errno;
  if (fd >= 0) ::close(fd);
  return ok;
}

std::string read_or_empty(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The value of "key N" in a flat-keyed cgroup file (memory.events, memory.oom_control); -1: absent.
long keyed(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string k;
  long v = 0;
  while (in >> k >> v)
    if (k == key) return v;
  return -1;
}

bool has_word(const std::string& list, const std::string& word, char sep) {
  std::stringstream ss(list);
  for (std::string w; std::getline(ss, w, sep);)
    if (w == word) return true;
  return false;
}

// Our own cgroup folder in the hierarchy mounted with fstype and (v1) controller; empty: none.
fs::path own_cgroup_dir(const std::string& fstype, const std::string& controller) {
  std::string cg_path;
  std::istringstream cg(read_or_empty("/proc/self/cgroup"));  // "4:memory:/a/b", "0::/a"
  for (std::string line; std::getline(cg, line);) {
    auto c1 = line.find(':'), c2 = line.find(':', c1 + 1);
    if (c1 == std::string::npos || c2 == std::string::npos) continue;
    std::string ctrls = line.substr(c1 + 1, c2 - c1 - 1);
    if (controller.empty() ? ctrls.empty() : has_word(ctrls, controller, ',')) cg_path = line.substr(c2 + 1);
  }
  if (cg_path.empty()) return {};
  std::istringstream mi(read_or_empty("/proc/self/mountinfo"));
  for (std::string line; std::getline(mi, line);) {
    std::istringstream f(line);
    std::string id, parent, dev, root, point, word;
    f >> id >> parent >> dev >> root >> point;
    while (f >> word && word != "-") {}
    std::string type, source, super;
    f >> type >> source >> super;
    if (type != fstype || (!controller.empty() && !has_word(super, controller, ','))) continue;
    // A mount of a sub-tree (cgroup namespaces, containers) shows paths relative to its root.
    std::string rel = cg_path;
    if (root != "/" && is_under(rel, root)) rel = rel.substr(root.size());
    fs::path dir = fs::path(rel).relative_path().empty() ? fs::path(point) : fs::path(point) / fs::path(rel).relative_path();
    if (fs::is_directory(dir)) return dir;
  }
  return {};
}

// Empty opforge-<pid>-<n> folders whose creator is dead (it was SIGKILLed before removing them).
void sweep_stale(const fs::path& base) {
  std::error_code ec;
  for (auto& e : fs::directory_iterator(base, ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind("opforge-", 0) != 0 || !e.is_directory()) continue;
    long pid = std::strtol(name.c_str() + 8, nullptr, 10);
    if (pid <= 0 || pid == ::getpid() || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    if (::rmdir(e.path().c_str()) == 0) spdlog::debug("removed the stale cgroup {}", e.path().string());
  }
}

struct CgroupEvents {
  long oom_kills = 0;       // -1: the kernel does not count them (v1 before 4.13)
  long mem_failcnt = 0;     // v1: times the limit was hit
  long pids_max_hits = 0;
};

class Cgroup {
 public:
  Cgroup() = default;
  Cgroup(const Cgroup&) = delete;
  Cgroup& operator=(const Cgroup&) = delete;
  ~Cgroup() { remove(); }

  // Tries v2, then v1; without either, limits().why says what was refused.
  void setup(std::size_t memory_mb, std::size_t max_pids);
  const Limits& limits() const { return limits_; }
  // Open cgroup.procs files (O_CLOEXEC); the launched child writes "0" (itself) into each.
  const std::vector<int>& procs_fds() const { return procs_fds_; }
  void kill_all();
  CgroupEvents events() const;
  void remove();

 private:
  std::string try_v2(std::size_t memory_mb, std::size_t max_pids);
  std::string try_v1(std::size_t memory_mb, std::size_t max_pids);
  std::string make(const std::vector<fs::path>& bases);
  int version_ = 0;
  std::vector<fs::path> dirs_;
  std::vector<int> procs_fds_;
  Limits limits_;
};

std::string cgroup_name() {
  static std::atomic<int> counter{0};
  return fmt::format("opforge-{}-{}", ::getpid(), counter++);
}

// mkdir our cgroup under each base (v1: one per hierarchy) and open its cgroup.procs.
std::string Cgroup::make(const std::vector<fs::path>& bases) {
  std::string name = cgroup_name();
  for (auto& b : bases) {
    sweep_stale(b);
    fs::path d = b / name;
    if (::mkdir(d.c_str(), 0755) != 0) return fmt::format("cannot create {}: {}", d.string(), std::strerror(errno));
    dirs_.push_back(d);
    int fd = ::open((d / "cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return fmt::format("cannot open {}/cgroup.procs: {}", d.string(), std::strerror(errno));
    procs_fds_.push_back(fd);
  }
  return "";
}

std::string Cgroup::try_v2(std::size_t memory_mb, std::size_t max_pids) {
  fs::path base = own_cgroup_dir("cgroup2", "");
  if (base.empty()) return "v2: no cgroup2 hierarchy holds this process";
  std::string have = read_or_empty(base / "cgroup.controllers");
  if (!has_word(have, "memory", ' ') || !has_word(have, "pids", ' '))
    return fmt::format("v2: {} lacks the memory and pids controllers (has: {})", base.string(),
                       have.empty() ? "none" : have.substr(0, have.find('\n')));
  std::string on = read_or_empty(base / "cgroup.subtree_control");
  int err = 0;
  if ((!has_word(on, "memory", ' ') || !has_word(on, "pids", ' ')) &&
      !write_text(base / "cgroup.subtree_control", "+memory +pids", &err))
    return fmt::format("v2: cannot enable memory and pids in {}/cgroup.subtree_control: {} (run opforge in a "
                       "delegated cgroup, e.g. systemd-run --scope -p Delegate=yes)",
                       base.string(), std::strerror(err));
  if (auto why = make({base}); !why.empty()) return "v2: " + why;
  fs::path d = dirs_[0];
  if (memory_mb && !write_text(d / "memory.max", std::to_string(memory_mb << 20), &err))
    return fmt::format("v2: cannot set {}/memory.max: {}", d.string(), std::strerror(err));
  if (memory_mb) {
    write_text(d / "memory.swap.max", "0");  // absent without swap accounting
    write_text(d / "memory.oom.group", "1");  // an OOM ends the whole sandbox, not one random process
  }
  if (max_pids && !write_text(d / "pids.max", std::to_string(max_pids), &err))
    return fmt::format("v2: cannot set {}/pids.max: {}", d.string(), std::strerror(err));
  version_ = 2;
  return "";
}

std::string Cgroup::try_v1(std::size_t memory_mb, std::size_t max_pids) {
  fs::path mem = own_cgroup_dir("cgroup", "memory"), pids = own_cgroup_dir("cgroup", "pids");
  if (mem.empty() || pids.empty()) return "v1: no memory and pids hierarchies hold this process";
  if (::access(mem.c_str(), W_OK) != 0 || ::access(pids.c_str(), W_OK) != 0)
    return fmt::format("v1: {} or {} is not writable by uid {}", mem.string(), pids.string(), ::getuid());
  if (auto why = make({mem, pids}); !why.empty()) return "v1: " + why;
  int err = 0;
  if (memory_mb) {
    std::string bytes = std::to_string(memory_mb << 20);
    if (!write_text(dirs_[0] / "memory.limit_in_bytes", bytes, &err))
      return fmt::format("v1: cannot set {}/memory.limit_in_bytes: {}", dirs_[0].string(), std::strerror(err));
    write_text(dirs_[0] / "memory.memsw.limit_in_bytes", bytes);  // absent without swap accounting
  }
  if (max_pids && !write_text(dirs_[1] / "pids.max", std::to_string(max_pids), &err))
    return fmt::format("v1: cannot set {}/pids.max: {}", dirs_[1].string(), std::strerror(err));
  version_ = 1;
  return "";
}

void Cgroup::setup(std::size_t memory_mb, std::size_t max_pids) {
  std::string why2 = try_v2(memory_mb, max_pids);
  if (version_ == 0) {
    remove();
    std::string why1 = try_v1(memory_mb, max_pids);
    if (version_ == 0) {
      remove();
      limits_.why = why2 + "; " + why1;
      return;
    }
  }
  limits_.mechanism = version_ == 2 ? "cgroup v2" : "cgroup v1";
  limits_.memory_mb = memory_mb;
  limits_.max_pids = max_pids;
}

void Cgroup::kill_all() {
  if (version_ == 2 && !dirs_.empty()) write_text(dirs_[0] / "cgroup.kill", "1");  // kernel 5.14+
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    bool any = false;
    for (auto& d : dirs_) {
      std::istringstream in(read_or_empty(d / "cgroup.procs"));
      for (long pid; in >> pid;) {
        any = true;
        ::kill(static_cast<pid_t>(pid), SIGKILL);
      }
    }
    if (!any) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  spdlog::warn("sandbox cgroup {} still has processes after SIGKILL", dirs_.empty() ? "" : dirs_[0].string());
}

CgroupEvents Cgroup::events() const {
  CgroupEvents ev;
  if (version_ == 2) {
    ev.oom_kills = keyed(read_or_empty(dirs_[0] / "memory.events"), "oom_kill");
    ev.pids_max_hits = keyed(read_or_empty(dirs_[0] / "pids.events"), "max");
  } else if (version_ == 1) {
    ev.oom_kills = keyed(read_or_empty(dirs_[0] / "memory.oom_control"), "oom_kill");
    std::istringstream(read_or_empty(dirs_[0] / "memory.failcnt")) >> ev.mem_failcnt;
    ev.pids_max_hits = keyed(read_or_empty(dirs_[1] / "pids.events"), "max");
  }
  return ev;
}

void Cgroup::remove() {
  for (int fd : procs_fds_) ::close(fd);
  procs_fds_.clear();
  if (dirs_.empty()) return;
  kill_all();
  for (auto& d : dirs_) {
    // Exiting tasks leave the cgroup a moment after they are reaped.
    int rc = ::rmdir(d.c_str());
    for (int i = 0; i < 400 && rc != 0 && errno == EBUSY; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      rc = ::rmdir(d.c_str());
    }
    if (rc != 0) spdlog::warn("could not remove the sandbox cgroup {}: {}", d.string(), std::strerror(errno));
  }
  dirs_.clear();
  version_ = 0;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Launching.

namespace {

volatile sig_atomic_t g_child = 0;
volatile sig_atomic_t g_signal = 0;

void on_stop_signal(int sig) {
  g_signal = sig;
  if (g_child > 0) ::kill(g_child, SIGKILL);
}

constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGHUP};

// While a sandbox runs: SIGTERM/SIGINT/SIGHUP kill it (and are remembered), and this process is a
// child subreaper, so bwrap's pid 1 is reaped here should bwrap die first. The signals stay
// blocked from before fork until the child's pid is known, so none is lost in between.
class SignalGuard {
 public:
  SignalGuard() {
    g_signal = 0;
    g_child = 0;
    sigset_t stop;
    sigemptyset(&stop);
    for (int s : kStopSignals) sigaddset(&stop, s);
    ::sigprocmask(SIG_BLOCK, &stop, &old_mask_);
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    for (std::size_t i = 0; i < std::size(kStopSignals); ++i) ::sigaction(kStopSignals[i], &sa, &old_[i]);
    // An inherited SIG_IGN for SIGCHLD would auto-reap bwrap and lose its status.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    ::sigaction(SIGCHLD, &dfl, &old_chld_);
    ::prctl(PR_GET_CHILD_SUBREAPER, &old_subreaper_);
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  }
  void started(pid_t pid) {
    g_child = pid;
    ::sigprocmask(SIG_SETMASK, &old_mask_, nullptr);  // a pending stop signal is handled now
  }
  ~SignalGuard() {
    ::sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
    g_child = 0;
    for (std::size_t i = 0; i < std::size(kStopSignals); ++i) ::sigaction(kStopSignals[i], &old_[i], nullptr);
    ::sigaction(SIGCHLD, &old_chld_, nullptr);
    ::prctl(PR_SET_CHILD_SUBREAPER, old_subreaper_);
  }
  const sigset_t& old_mask() const { return old_mask_; }

 private:
  sigset_t old_mask_{};
  struct sigaction old_[std::size(kStopSignals)] {};
  struct sigaction old_chld_ {};
  int old_subreaper_ = 0;
};

// What the forked child needs, prepared before fork: after it only async-signal-safe calls.
struct ChildPlan {
  std::vector<char*> argv;
  std::vector<int> cgroup_fds;
  std::vector<int> keep;  // sorted, the error pipe included
  int err_fd = -1;
  int stderr_fd = -1;
  pid_t parent = 0;
  sigset_t mask{};
  unsigned max_fd = 0;  // for closing one by one where close_range is missing
};

enum ChildStage : int { kJoinCgroup = 1, kKeepFd = 2, kExec = 3, kParentGone = 4 };

[[noreturn]] void child_fail(int fd, int stage, int err) {
  int msg[2] = {stage, err};
  [[maybe_unused]] auto n = ::write(fd, msg, sizeof msg);
  ::_exit(125);
}

void close_fds(unsigned lo, unsigned hi, unsigned max_fd) {
  if (::close_range(lo, hi, 0) == 0) return;
  for (unsigned fd = lo; fd <= std::min(hi, max_fd); ++fd) ::close(static_cast<int>(fd));  // kernel < 5.9
}

void close_other_fds(const std::vector<int>& keep, unsigned max_fd) {
  unsigned lo = 3;
  for (int k : keep) {
    if (static_cast<unsigned>(k) > lo) close_fds(lo, static_cast<unsigned>(k) - 1, max_fd);
    lo = std::max(lo, static_cast<unsigned>(k) + 1);
  }
  close_fds(lo, ~0U, max_fd);
}

[[noreturn]] void child_exec(const ChildPlan& p) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a SIGKILLed launcher takes bwrap and so the sandbox with it
  if (::getppid() != p.parent) child_fail(p.err_fd, kParentGone, 0);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int s : {SIGTERM, SIGINT, SIGHUP, SIGPIPE, SIGCHLD}) ::sigaction(s, &dfl, nullptr);
  ::sigprocmask(SIG_SETMASK, &p.mask, nullptr);
  // Joining before exec: bwrap and everything it starts is inside from its first instruction.
  for (int fd : p.cgroup_fds)
    if (::write(fd, "0", 1) != 1) child_fail(p.err_fd, kJoinCgroup, errno);
  if (p.stderr_fd >= 0) ::dup2(p.stderr_fd, 2);
  for (int fd : p.keep) {
    if (fd == p.err_fd) continue;
    int flags = ::fcntl(fd, F_GETFD);
    if (flags < 0 || ::fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC) < 0) child_fail(p.err_fd, kKeepFd, errno);
  }
  close_other_fds(p.keep, p.max_fd);
  ::execv(p.argv[0], p.argv.data());
  child_fail(p.err_fd, kExec, errno);
}

// Forks the child that becomes bwrap; returns once bwrap runs (or throws why it could not).
pid_t spawn_bwrap(std::vector<std::string>& args, const Cgroup& cg, const SandboxSpec& spec, int stderr_fd,
                  SignalGuard& guard) {
  int err[2];
  OPFORGE_CHECK(::pipe2(err, O_CLOEXEC) == 0, "cannot create a pipe: {}", std::strerror(errno));
  ChildPlan plan;
  for (auto& a : args) plan.argv.push_back(a.data());
  plan.argv.push_back(nullptr);
  plan.cgroup_fds = cg.procs_fds();
  plan.keep = spec.keep_fds;
  plan.keep.push_back(err[1]);
  std::sort(plan.keep.begin(), plan.keep.end());
  plan.err_fd = err[1];
  plan.stderr_fd = stderr_fd;
  plan.parent = ::getpid();
  plan.mask = guard.old_mask();
  struct rlimit nofile {};
  ::getrlimit(RLIMIT_NOFILE, &nofile);
  plan.max_fd = static_cast<unsigned>(std::min<rlim_t>(nofile.rlim_cur, 1 << 20));
  pid_t pid = ::fork();
  if (pid == 0) child_exec(plan);
  int fork_errno = errno;
  ::close(err[1]);
  if (pid < 0) ::close(err[0]);
  OPFORGE_CHECK(pid > 0, "cannot fork the sandbox: {}", std::strerror(fork_errno));
  guard.started(pid);
  int msg[2] = {0, 0};
  ssize_t n;
  while ((n = ::read(err[0], msg, sizeof msg)) < 0 && errno == EINTR) {}
  ::close(err[0]);
  if (n != static_cast<ssize_t>(sizeof msg)) return pid;  // EOF: exec succeeded
  while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {}
  const char* what = msg[0] == kJoinCgroup ? "joining its cgroup"
                     : msg[0] == kKeepFd   ? "keeping keep_fds open"
                     : msg[0] == kExec     ? "exec of bwrap"
                                           : "start (the launcher's parent went away)";
  throw Error(fmt::format("the sandbox failed at {}: {} ({})", what, std::strerror(msg[1]), args[0]));
}

int wait_status(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return 255;
  }
  return status;
}

// bwrap's pid 1, reparented here when bwrap was killed; once it is gone its namespace is empty.
void reap_orphans() {
  while (true) {
    pid_t r = ::waitpid(-1, nullptr, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return;  // ECHILD
  }
}

// bwrap makes the mount points of ro/rw paths under /work in the host's work folder; those that
// were not there before the run are removed after it, where still empty (left as they were).
std::vector<fs::path> work_stubs(const SandboxSpec& spec) {
  std::vector<fs::path> out;
  if (spec.work.empty()) return out;
  for (auto* list : {&spec.ro, &spec.rw})
    for (auto& p : *list) {
      if (!is_under(p, "/work")) continue;
      fs::path host = spec.work;
      for (auto& part : fs::path(p).lexically_relative("/work")) {
        host /= part;
        std::error_code ec;
        if (!fs::exists(fs::symlink_status(host, ec))) out.push_back(host);
      }
    }
  return out;
}

void remove_stubs(std::vector<fs::path> stubs) {
  std::sort(stubs.begin(), stubs.end(), [](auto& a, auto& b) { return a.native().size() > b.native().size(); });
  for (auto& p : stubs) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) ::rmdir(p.c_str());  // fails, as it should, when the sandbox wrote into it
    if (S_ISREG(st.st_mode) && st.st_size == 0) ::unlink(p.c_str());
  }
}

void check_host_paths(const SandboxSpec& spec) {
  for (auto* list : {&spec.ro, &spec.rw})
    for (auto& p : *list)
      OPFORGE_CHECK(fs::exists(p), "sandbox spec: \"{}\" path {} does not exist", list == &spec.ro ? "ro" : "rw", p);
  if (!spec.work.empty())
    OPFORGE_CHECK(fs::is_directory(spec.work), "sandbox spec: \"work\" folder {} does not exist", spec.work);
}

void read_outcome(SandboxRun& run, const CgroupEvents& ev, int status) {
  bool killed = WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGKILL);
  // A v1 kernel without the oom_kill counter: a SIGKILL after the limit was hit is the OOM killer.
  if (ev.oom_kills > 0 || (ev.oom_kills < 0 && ev.mem_failcnt > 0 && killed && !run.terminated)) {
    run.out_of_memory = true;
    run.exit_code = 128 + SIGKILL;
    run.notes.push_back(fmt::format("out_of_memory: the sandbox reached its memory limit of {} MiB ({}); the "
                                    "kernel's OOM killer ended {} process(es)",
                                    run.limits.memory_mb, run.limits.mechanism, std::max(ev.oom_kills, 1L)));
  }
  if (ev.pids_max_hits > 0) {
    run.pids_limit = true;
    run.notes.push_back(fmt::format("pids_limit: the sandbox reached its limit of {} processes ({}); {} fork(s) "
                                    "failed",
                                    run.limits.max_pids, run.limits.mechanism, ev.pids_max_hits));
  }
  if (run.terminated)
    run.notes.push_back(fmt::format("terminated: {} received; the sandbox was killed", strsignal(g_signal)));
}

}  // namespace

SandboxRun run_sandbox(const SandboxSpec& spec, const std::vector<std::string>& command, int stderr_fd) {
  check_host_paths(spec);
  // Checked before we open anything ourselves, which could take a missing fd's number.
  for (int fd : spec.keep_fds)
    OPFORGE_CHECK(::fcntl(fd, F_GETFD) >= 0, "sandbox spec: \"keep_fds\" lists fd {}, which is not open", fd);
  std::string bwrap = find_bwrap();
  OPFORGE_CHECK(!bwrap.empty(), "{}", bwrap_missing());
  auto args = bwrap_argv(spec, command);
  args[0] = bwrap;
  SandboxRun run;
  SignalGuard guard;  // before the cgroup exists, so a stop signal cannot leave it behind
  Cgroup cg;
  cg.setup(spec.memory_mb, spec.max_pids);
  run.limits = cg.limits();
  if (run.limits.mechanism == "none" && (spec.memory_mb || spec.max_pids))
    run.notes.push_back(fmt::format("limits: none ({})", run.limits.why));
  if (spdlog::should_log(spdlog::level::debug)) spdlog::debug("sandbox: {}", describe(spec, run.limits));
  std::vector<fs::path> stubs = work_stubs(spec);
  pid_t pid = spawn_bwrap(args, cg, spec, stderr_fd, guard);
  int status = wait_status(pid);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  run.terminated = g_signal != 0;
  reap_orphans();
  cg.kill_all();
  read_outcome(run, cg.events(), status);
  cg.remove();
  remove_stubs(std::move(stubs));
  return run;
}

nlohmann::json probe_sandbox(bool gpu) {
  json r = {{"ok", false}, {"bwrap", ""}, {"version", ""}, {"profile", ""}, {"limits", "none"}, {"why", ""}};
  try {
    std::string bwrap = find_bwrap();
    OPFORGE_CHECK(!bwrap.empty(), "{}", bwrap_missing());
    r["bwrap"] = bwrap;
    r["version"] = bwrap_version(bwrap);
    OPFORGE_CHECK(r["version"] != "", "`{} --version` does not answer: reinstall bubblewrap", bwrap);
    std::error_code ec;
    OPFORGE_CHECK(!gpu || fs::exists("/dev/nvidiactl", ec), "gpu: no /dev/nvidiactl here (is the NVIDIA driver loaded?)");
    SandboxSpec spec;
    spec.gpu = gpu;
    spec.memory_mb = 256;
    spec.max_pids = 64;
    // bwrap's own complaint ("setting up uid map: Permission denied") is the useful why.
    int err = ::memfd_create("opforge-sandbox-probe", MFD_CLOEXEC);
    OPFORGE_CHECK(err >= 0, "memfd_create: {}", std::strerror(errno));
    SandboxRun run;
    try {
      run = run_sandbox(spec, {"true"}, err);
    } catch (...) {
      ::close(err);
      throw;
    }
    std::string text(4096, '\0');
    text.resize(static_cast<std::size_t>(std::max<ssize_t>(0, ::pread(err, text.data(), text.size(), 0))));
    ::close(err);
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    r["limits"] = run.limits.mechanism;
    r["profile"] = describe(spec, run.limits);
    r["ok"] = run.exit_code == 0;
    if (run.exit_code != 0)
      r["why"] = fmt::format("bwrap cannot start a sandbox here (exit {}): {}", run.exit_code, text);
    else if (run.limits.mechanism == "none")
      r["why"] = fmt::format("limits: none ({})", run.limits.why);
  } catch (const std::exception& e) {
    r["why"] = describe(e);
  }
  return r;
}

}  // namespace opforge

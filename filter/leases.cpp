#include "leases.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <vector>

#include "opforge/core/error.h"

namespace opforge::filter {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string first_line(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::string line;
  std::getline(f, line);
  return line;
}

std::string hostname() {
  char buf[256] = {};
  return gethostname(buf, sizeof buf - 1) == 0 ? std::string(buf) : std::string("unknown-host");
}

// Two processes of one PID namespace see each other's PIDs; across namespaces (containers) a PID
// says nothing, so there only the heartbeat tells.
std::string pid_namespace() {
  std::error_code ec;
  auto target = std::filesystem::read_symlink("/proc/self/ns/pid", ec);
  return ec ? std::string() : target.string();
}

// The start time of a process (field 22 of /proc/PID/stat, in clock ticks since boot), or "" when
// there is no such process: with the PID it names one process for the whole boot.
std::string start_time(long pid) {
  std::string stat = first_line("/proc/" + std::to_string(pid) + "/stat");
  auto close = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return "";
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
  }
  return field;
}

// Inside the caller's transaction: a holder and every lease it has.
void drop_holder(Db& db, const std::string& holder) {
  for (auto* sql : {"DELETE FROM filter_leases WHERE holder = ?", "DELETE FROM filter_holders WHERE holder = ?"})
    db.prepare(sql).bind(1, holder).run();
}

}  // namespace

LeaseHolder::LeaseHolder(Db& db, double stale_s, const std::string& shard)
    : db_(db), stale_s_(stale_s), host_(hostname()), boot_(first_line("/proc/sys/kernel/random/boot_id")),
      pidns_(pid_namespace()), pid_(static_cast<long>(::getpid())), start_(start_time(pid_)) {
  id_ = fmt::format("{}/{}/{}/{}", host_, boot_, pidns_, pid_);
  db_.transaction([&] {
    drop_holder(db_, id_);  // a holder with this id was an earlier process with our PID: it is gone
    auto st = db_.prepare(
        "INSERT INTO filter_holders(holder, host, boot, pidns, pid, pid_start, shard, started_at, heartbeat) "
        "VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?)");
    st.bind(1, id_).bind(2, host_).bind(3, boot_).bind(4, pidns_).bind(5, static_cast<std::int64_t>(pid_));
    st.bind(6, start_).bind(7, shard).bind(8, now_s()).bind(9, now_s()).run();
  });
  // Four beats within the stale limit, at most every 30 s.
  double every = std::clamp(stale_s_ / 4, 0.2, 30.0);
  heartbeat_ = std::thread([this, file = db_.path(), every] { heartbeat_loop(file, every); });
}

LeaseHolder::~LeaseHolder() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  try {
    db_.transaction([&] { drop_holder(db_, id_); });
  } catch (const std::exception& e) {
    // Left behind, they expire: this PID will be gone.
    spdlog::warn("could not release this filter's leases ({}); the next filter takes them over", describe(e));
  }
}

void LeaseHolder::heartbeat_loop(std::filesystem::path db_file, double every_s) {
  try {
    Db db(db_file);
    std::unique_lock lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::duration<double>(every_s), [&] { return stop_; })) {
      lock.unlock();
      auto st = db.prepare("UPDATE filter_holders SET heartbeat = ? WHERE holder = ?");
      st.bind(1, now_s()).bind(2, id_).run();
      if (sqlite3_changes(db.raw()) == 0)
        spdlog::warn("another filter found this one gone (a heartbeat older than its --lease-stale-s) and took over "
                     "its leases; a task both judge keeps the later verdict, the earlier in its history");
      lock.lock();
    }
  } catch (const std::exception& e) {
    spdlog::warn("the filter's lease heartbeat stopped: {}", describe(e));
  }
}

long LeaseHolder::expire_dead() {
  struct Gone {
    std::string holder, why;
  };
  std::vector<Gone> gone;
  auto st = db_.prepare(
      "SELECT holder, host, boot, pidns, pid, pid_start, heartbeat FROM filter_holders WHERE holder != ?");
  st.bind(1, id_);
  const double now = now_s();
  while (st.step()) {
    std::string host = st.text(1), boot = st.text(2), pidns = st.text(3);
    long pid = static_cast<long>(st.int64(4));
    double age = now - st.real(6);
    if (host == host_ && boot != boot_)
      gone.push_back({st.text(0), "its machine restarted since"});
    else if (host == host_ && pidns == pidns_ && start_time(pid) != st.text(5))
      gone.push_back({st.text(0), fmt::format("process {} is gone", pid)});
    else if ((host != host_ || pidns != pidns_) && age > stale_s_)
      gone.push_back({st.text(0), fmt::format("no heartbeat for {:.0f} s", age)});
  }
  long taken = 0;
  for (auto& g : gone) {
    auto n = db_.prepare("SELECT count(*) FROM filter_leases WHERE holder = ?");
    n.bind(1, g.holder);
    n.step();
    long leases = static_cast<long>(n.int64(0));
    drop_holder(db_, g.holder);
    spdlog::info("filter {} is gone ({}): its {} lease(s) taken over", g.holder, g.why, leases);
    taken += leases;
  }
  // Leases without a holder (not made by this code, but cheap to be sure of).
  db_.exec("DELETE FROM filter_leases WHERE holder NOT IN (SELECT holder FROM filter_holders)");
  taken += sqlite3_changes(db_.raw());
  return taken;
}

void LeaseHolder::lease(const std::string& task_id) {
  db_.prepare("INSERT INTO filter_leases(task_id, holder, leased_at) VALUES(?, ?, ?)")
      .bind(1, task_id)
      .bind(2, id_)
      .bind(3, now_s())
      .run();
}

void LeaseHolder::release(const std::string& task_id) {
  db_.prepare("DELETE FROM filter_leases WHERE task_id = ? AND holder = ?").bind(1, task_id).bind(2, id_).run();
}

}  // namespace opforge::filter

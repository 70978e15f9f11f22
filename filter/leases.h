// Leases: which `opforge filter` process is judging which task, so that processes sharing one
// workspace (two filters, the shards of an array job) never judge the same task.
//
// A process registers as a holder (filter_holders: hostname, boot id, PID namespace and PID, and a
// heartbeat it refreshes from a thread of its own) and leases the tasks it claims
// (filter_leases); a lease goes when its verdict is committed, and all of them when the holder
// ends. A holder that ended without that (SIGKILL, a lost machine) is found dead by the next
// process that claims: on the same host, boot and PID namespace when its PID is gone (or is
// another process), elsewhere when its heartbeat is older than the stale limit. Its leases are
// then taken over.
//
// Thread safety: a LeaseHolder is used from one thread; its heartbeat thread has its own connection.
#pragma once
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>

#include "opforge/core/store.h"

namespace opforge::filter {

// The tables (filter_holders, filter_leases) are part of the filter's schema (filter.cpp: migrate).
class LeaseHolder {
 public:
  // Registers this process; `stale_s`: how old the heartbeat of a holder on another host (or in
  // another PID namespace) may be before it counts as gone.
  LeaseHolder(Db& db, double stale_s, const std::string& shard);
  // Releases every lease and the registration.
  ~LeaseHolder();
  LeaseHolder(const LeaseHolder&) = delete;
  LeaseHolder& operator=(const LeaseHolder&) = delete;

  const std::string& id() const { return id_; }
  // Inside the caller's transaction: removes holders found dead and their leases; returns how
  // many leases were taken over that way.
  long expire_dead();
  // Inside the caller's transaction.
  void lease(const std::string& task_id);
  void release(const std::string& task_id);

 private:
  void heartbeat_loop(std::filesystem::path db_file, double every_s);
  Db& db_;
  double stale_s_;
  std::string id_, host_, boot_, pidns_;
  long pid_ = 0;
  std::string start_;  // the process's start time (/proc/PID/stat), so a reused PID is not us
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread heartbeat_;
};

}  // namespace opforge::filter

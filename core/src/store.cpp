#include "opforge/core/store.h"

#include <chrono>
#include <thread>

#include <spdlog/spdlog.h>

#include "opforge/core/error.h"
#include "opforge/core/log.h"

namespace opforge {

namespace {
[[noreturn]] void fail(sqlite3* db, std::string_view what, std::string_view sql) {
  throw Error(fmt::format("SQLite error in {} ({}): {}", what,
                          sql.size() > 80 ? std::string(sql.substr(0, 80)) + "…" : std::string(sql),
                          db ? sqlite3_errmsg(db) : "no database"));
}
// The connection's set-up, retried while another connection holds the lock it needs: SQLite
// answers SQLITE_BUSY at once, without the busy handler, where waiting could deadlock (switching a
// fresh database to WAL while another connection does the same), and connections opening one
// fresh workspace at once (filter shards, a test's threads) failed to open instead of waiting.
void setup_exec(sqlite3* db, const char* sql, const std::filesystem::path& file) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (int rc;;) {
    rc = sqlite3_exec(db, sql, nullptr, nullptr, nullptr);
    if (rc == SQLITE_OK) return;
    if ((rc & 0xff) != SQLITE_BUSY && (rc & 0xff) != SQLITE_LOCKED) break;
    if (std::chrono::steady_clock::now() > until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  fail(db, "setting up " + file.string(), sql);
}
}  // namespace

Stmt::Stmt(sqlite3* db, std::string_view sql) : db_(db), sql_(sql) {
  if (sqlite3_prepare_v2(db, sql_.c_str(), static_cast<int>(sql_.size()), &stmt_, nullptr) != SQLITE_OK)
    fail(db, "prepare", sql_);
}

Stmt::~Stmt() { sqlite3_finalize(stmt_); }

Stmt::Stmt(Stmt&& o) noexcept : db_(o.db_), stmt_(o.stmt_), sql_(std::move(o.sql_)) { o.stmt_ = nullptr; }

Stmt& Stmt::bind(int i, std::string_view v) {
  if (sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT) != SQLITE_OK)
    fail(db_, "bind", sql_);
  return *this;
}
Stmt& Stmt::bind(int i, std::int64_t v) {
  if (sqlite3_bind_int64(stmt_, i, v) != SQLITE_OK) fail(db_, "bind", sql_);
  return *this;
}
Stmt& Stmt::bind(int i, double v) {
  if (sqlite3_bind_double(stmt_, i, v) != SQLITE_OK) fail(db_, "bind", sql_);
  return *this;
}
Stmt& Stmt::bind_null(int i) {
  if (sqlite3_bind_null(stmt_, i) != SQLITE_OK) fail(db_, "bind", sql_);
  return *this;
}

bool Stmt::step() {
  int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  fail(db_, "step", sql_);
}

void Stmt::run() {
  while (step()) {
  }
}

void Stmt::reset() {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
}

bool Stmt::is_null(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
std::string Stmt::text(int col) const {
  auto p = sqlite3_column_text(stmt_, col);
  return p ? std::string(reinterpret_cast<const char*>(p), sqlite3_column_bytes(stmt_, col)) : std::string();
}
std::int64_t Stmt::int64(int col) const { return sqlite3_column_int64(stmt_, col); }
double Stmt::real(int col) const { return sqlite3_column_double(stmt_, col); }

Db::Db(const std::filesystem::path& file) : path_(file) {
  if (sqlite3_open_v2(file.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) != SQLITE_OK) {
    std::string msg = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    throw Error(fmt::format("cannot open database {}: {} (check the --workspace folder is writable)",
                            file.string(), msg));
  }
  sqlite3_busy_timeout(db_, 30000);
  // WAL: readers (opforge status) never block the writer; a killed writer leaves a consistent db.
  try {
    for (const char* sql : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL", "PRAGMA foreign_keys=ON",
                            "CREATE TABLE IF NOT EXISTS schema_versions (component TEXT PRIMARY KEY, version INTEGER NOT NULL)"})
      setup_exec(db_, sql, file);
  } catch (...) {
    sqlite3_close(db_);  // the destructor does not run for a constructor that throws
    throw;
  }
}

Db::~Db() { sqlite3_close_v2(db_); }

bool Db::has_table(std::string_view name) {
  auto st = prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?");
  st.bind(1, std::string(name));
  return st.step();
}

void Db::exec(std::string_view sql) {
  std::string s(sql);
  char* err = nullptr;
  if (sqlite3_exec(db_, s.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : sqlite3_errmsg(db_);
    sqlite3_free(err);
    throw Error(fmt::format("SQLite error in exec ({}): {} [{}]", s.substr(0, 80), msg, path_.string()));
  }
}

void Db::transaction(const std::function<void()>& f) {
  exec("BEGIN IMMEDIATE");
  try {
    f();
  } catch (...) {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
  exec("COMMIT");
}

int Db::schema_version(std::string_view component) {
  auto st = prepare("SELECT version FROM schema_versions WHERE component = ?");
  st.bind(1, component);
  return st.step() ? static_cast<int>(st.int64(0)) : 0;
}

// Each step reads the version and applies the next migration inside one BEGIN IMMEDIATE, so
// processes opening a fresh workspace at once (shards, two filters) apply every migration once:
// the second waits for the first's write lock, then finds the version already moved.
void Db::migrate(std::string_view component, const std::vector<std::string>& migrations) {
  const int want = static_cast<int>(migrations.size());
  for (bool more = true; more;) {
    transaction([&] {
      int have = schema_version(component);
      OPFORGE_CHECK(have <= want,
                    "workspace {} has {} schema version {}, newer than this opforge ({}): use a newer "
                    "opforge or a fresh --workspace",
                    path_.string(), component, have, want);
      more = have < want;
      if (!more) return;
      exec(migrations[have]);
      auto st = prepare(
          "INSERT INTO schema_versions(component, version) VALUES(?, ?) "
          "ON CONFLICT(component) DO UPDATE SET version = excluded.version");
      st.bind(1, component).bind(2, have + 1).run();
      spdlog::debug("migrated {} schema to version {}", component, have + 1);
    });
  }
}

Workspace::Workspace(const std::filesystem::path& root) : root_(root) {
  std::error_code ec;
  std::filesystem::create_directories(root_ / "logs", ec);
  OPFORGE_CHECK(!ec, "cannot create workspace folder {}: {} (pass a writable --workspace)", root_.string(),
                ec.message());
  add_log_file(logs_dir() / "opforge.log");
  db_ = std::make_unique<Db>(root_ / "opforge.db");
}

}  // namespace opforge

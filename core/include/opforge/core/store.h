// The workspace database: SQLite in WAL mode, versioned schema per component.
//
// Thread safety: a Db is used from one thread at a time (SQLite's serialized mode is not relied
// on). Several processes may open the same file; writes wait up to busy_timeout.
// Errors: every SQLite failure throws opforge::Error naming the statement and the file.
#pragma once
#include <sqlite3.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace opforge {

class Stmt {
 public:
  Stmt(sqlite3* db, std::string_view sql);
  ~Stmt();
  Stmt(Stmt&& other) noexcept;
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  // Bind by 1-based index. Chainable.
  Stmt& bind(int i, std::string_view v);
  Stmt& bind(int i, const char* v) { return bind(i, std::string_view(v)); }
  Stmt& bind(int i, const std::string& v) { return bind(i, std::string_view(v)); }
  Stmt& bind(int i, std::int64_t v);
  Stmt& bind(int i, int v) { return bind(i, static_cast<std::int64_t>(v)); }
  Stmt& bind(int i, double v);
  Stmt& bind_null(int i);
  template <class T>
  Stmt& bind(int i, const std::optional<T>& v) {
    return v ? bind(i, *v) : bind_null(i);
  }

  // Steps once; true when a row is available.
  bool step();
  // Steps to completion (for statements returning no rows).
  void run();
  void reset();

  bool is_null(int col) const;
  std::string text(int col) const;
  std::int64_t int64(int col) const;
  double real(int col) const;

 private:
  sqlite3* db_ = nullptr;
  sqlite3_stmt* stmt_ = nullptr;
  std::string sql_;
};

class Db {
 public:
  // Opens (creating if needed) the database file in WAL mode.
  explicit Db(const std::filesystem::path& file);
  ~Db();
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  void exec(std::string_view sql);
  Stmt prepare(std::string_view sql) { return Stmt(db_, sql); }
  // Runs f inside BEGIN IMMEDIATE … COMMIT; rolls back and rethrows on exception.
  void transaction(const std::function<void()>& f);

  // Applies migrations[v..] for `component`, each in its own transaction, recording the
  // version reached in the `schema_versions` table. A database newer than this binary fails.
  void migrate(std::string_view component, const std::vector<std::string>& migrations);
  int schema_version(std::string_view component);
  // Whether a table exists: a stage reading an earlier stage's table that never ran.
  bool has_table(std::string_view name);

  const std::filesystem::path& path() const { return path_; }
  sqlite3* raw() { return db_; }

 private:
  sqlite3* db_ = nullptr;
  std::filesystem::path path_;
};

// A workspace folder: opforge.db, logs/, artifacts.
class Workspace {
 public:
  // Creates the folder if needed, opens the database, attaches the log file.
  explicit Workspace(const std::filesystem::path& root);
  const std::filesystem::path& root() const { return root_; }
  std::filesystem::path logs_dir() const { return root_ / "logs"; }
  Db& db() { return *db_; }

 private:
  std::filesystem::path root_;
  std::unique_ptr<Db> db_;
};

}  // namespace opforge

#include "opforge/core/tasks.h"

namespace opforge::tasks {

void migrate(Db& db) {
  db.migrate("tasks", {R"sql(
CREATE TABLE tasks (
  id          TEXT PRIMARY KEY,
  code        TEXT NOT NULL,
  source      TEXT NOT NULL,
  backend     TEXT NOT NULL,
  num_ops     INTEGER NOT NULL DEFAULT 0,
  ops         TEXT NOT NULL DEFAULT '[]',
  seed_ids    TEXT NOT NULL DEFAULT '[]',
  provenance  TEXT NOT NULL DEFAULT '{}',
  created_at  TEXT NOT NULL DEFAULT (datetime('now'))
);
CREATE INDEX tasks_backend ON tasks(backend, num_ops);
)sql"});
}

bool insert(Db& db, const NewTask& t) {
  auto st = db.prepare(
      "INSERT INTO tasks(id, code, source, backend, num_ops, ops, seed_ids, provenance) VALUES(?, ?, ?, ?, ?, ?, ?, ?) "
      "ON CONFLICT(id) DO NOTHING");
  st.bind(1, t.id)
      .bind(2, t.code)
      .bind(3, t.source)
      .bind(4, t.backend)
      .bind(5, t.num_ops)
      .bind(6, t.ops.dump())
      .bind(7, t.seed_ids.dump())
      .bind(8, t.provenance.dump())
      .run();
  return sqlite3_changes(db.raw()) > 0;
}

long count(Db& db, const std::string& backend) {
  auto st = backend.empty() ? db.prepare("SELECT count(*) FROM tasks")
                            : db.prepare("SELECT count(*) FROM tasks WHERE backend = ?");
  if (!backend.empty()) st.bind(1, backend);
  st.step();
  return static_cast<long>(st.int64(0));
}

}  // namespace opforge::tasks

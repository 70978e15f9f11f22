// opforge env export: a working folder per task, as CUDA Agent's agent_workdir lays it out
// (agent/README.md). The templates are data/env/; this file fills and places them.
#include "env.h"

#include <fmt/format.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "evaluator.h"
#include "opforge/core/error.h"
#include "opforge/core/files.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace opforge::agent {

namespace {

// Files the agent reads but must not change: re-checked against .protected/ before the final
// evaluation (changed_protected). model_new.py and kernels/ are the agent's.
const std::vector<std::string> kProtected = {"model.py",         "SKILL.md",         "binding.cpp",
                                             "binding_registry.h", "utils/task.json", "utils/judge.py",
                                             "utils/compile.sh", "utils/verification.py", "utils/profiling.py"};
// Template (under data/env) of each file written, the task.json excepted.
const std::vector<std::string> kTemplates = {"SKILL.md",          "model_new.py",     "binding.cpp",
                                             "binding_registry.h", "utils/judge.py",  "utils/compile.sh",
                                             "utils/verification.py", "utils/profiling.py", "kernels/README.md"};

// {{name}} placeholders, filled once (as the prompts' templates are); an unknown one is an error.
std::string fill(const std::string& text, const std::map<std::string, std::string>& values, const fs::path& from) {
  static const std::regex ph(R"(\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\})");
  std::string out;
  auto last = text.cbegin();
  for (std::sregex_iterator it(text.begin(), text.end(), ph), end; it != end; ++it) {
    auto v = values.find((*it)[1].str());
    OPFORGE_CHECK(v != values.end(), "{}: the placeholder {{{{{}}}}} has no value (known: task_name, task_id)",
                  from.string(), (*it)[1].str());
    out.append(last, (*it)[0].first);
    out += v->second;
    last = (*it)[0].second;
  }
  out.append(last, text.cend());
  return out;
}

void write(const fs::path& p, const std::string& text, bool read_only) {
  fs::create_directories(p.parent_path());
  if (fs::exists(p)) fs::permissions(p, fs::perms::owner_write, fs::perm_options::add);
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  OPFORGE_CHECK(f.good(), "cannot write {}", p.string());
  if (read_only) fs::permissions(p, fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
  if (p.extension() == ".sh") fs::permissions(p, fs::perms::owner_exec | fs::perms::group_exec | fs::perms::others_exec,
                                              fs::perm_options::add);
}

// Folder names: the task's name, made safe and unique (two shards may share one).
std::vector<std::string> folder_names(const std::vector<evaluator::EvalTask>& tasks) {
  std::vector<std::string> names;
  std::set<std::string> seen;
  for (auto& t : tasks) {
    std::string n = std::regex_replace(t.name, std::regex("[^A-Za-z0-9_.-]"), "_");
    if (n.empty() || n[0] == '.' || seen.count(n)) n += "_" + t.id;
    seen.insert(n);
    names.push_back(n);
  }
  return names;
}

void export_one(const evaluator::EvalTask& t, const std::string& name, const fs::path& out, const fs::path& tpl) {
  std::map<std::string, std::string> values = {{"task_name", t.name}, {"task_id", t.id}};
  std::map<std::string, std::string> files = {{"model.py", t.code},
                                              {"utils/task.json", json{{"task_id", t.id}, {"name", t.name}}.dump(2) + "\n"}};
  for (auto& rel : kTemplates) files[rel] = fill(read_text(tpl / rel), values, tpl / rel);
  for (auto& [rel, text] : files) {
    bool prot = std::find(kProtected.begin(), kProtected.end(), rel) != kProtected.end();
    write(out / name / rel, text, prot);
    if (prot) write(out / ".protected" / name / rel, text, true);
  }
}

}  // namespace

const std::vector<std::string>& protected_files() { return kProtected; }

void reset_folder(const fs::path& out, const std::string& folder, const std::string& task_id, const std::string& name,
                  const std::string& code, const fs::path& data_dir) {
  OPFORGE_CHECK(!folder.empty() && folder.find('/') == std::string::npos && folder[0] != '.',
                "{}: not a working folder's name", folder);
  fs::remove_all(out / folder);
  fs::remove_all(out / ".protected" / folder);
  evaluator::EvalTask t;
  t.id = task_id;
  t.name = name;
  t.code = code;
  export_one(t, folder, out, data_dir / "env");
}

std::vector<std::string> exported_folders(const fs::path& out) {
  json m = json::parse(read_text(out / "manifest.json"), nullptr, false);
  OPFORGE_CHECK(m.is_object() && m.contains("tasks"), "{}: not a manifest of opforge env export",
                (out / "manifest.json").string());
  std::vector<std::string> names;
  for (auto& t : m["tasks"]) names.push_back(t.value("folder", ""));
  return names;
}

EnvExportResult export_envs(const EnvExportOptions& o) {
  auto tasks = evaluator::load_tasks(o.tasks);
  OPFORGE_CHECK(!tasks.empty(), "--tasks {}: no tasks there (shards, a workspace or .py files)", o.tasks.string());
  fs::path tpl = o.data_dir / "env";
  OPFORGE_CHECK(fs::is_directory(tpl), "{}: the working folder's templates are missing (data/env of the checkout)",
                tpl.string());
  auto names = folder_names(tasks);
  json manifest = {{"tasks", json::array()}, {"protected", kProtected}};
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    export_one(tasks[i], names[i], o.out, tpl);
    manifest["tasks"].push_back({{"task_id", tasks[i].id}, {"name", tasks[i].name}, {"folder", names[i]}});
  }
  EnvExportResult r{tasks.size(), o.out / "manifest.json"};
  write(r.manifest, manifest.dump(2) + "\n", false);
  return r;
}

std::vector<std::string> changed_protected(const fs::path& out, const std::string& task) {
  OPFORGE_CHECK(fs::is_directory(out / ".protected" / task), "{}: no such exported task (opforge env export first)",
                (out / task).string());
  std::vector<std::string> changed;
  for (auto& rel : kProtected) {
    fs::path mine = out / task / rel;
    if (!fs::is_regular_file(mine) || fs::is_symlink(mine) ||
        read_text(mine) != read_text(out / ".protected" / task / rel))
      changed.push_back(rel);
  }
  return changed;
}

}  // namespace opforge::agent

// opforge env: the agent's working folders in the CUDA Agent layout (agent/README.md).
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace opforge::agent {

struct EnvExportOptions {
  std::filesystem::path tasks;     // as opforge eval's --tasks: shards, a workspace, .py files
  std::filesystem::path out;       // one folder per task, and .protected/ beside them
  std::filesystem::path data_dir;  // the templates: <data>/env
};

struct EnvExportResult {
  std::size_t tasks = 0;
  std::filesystem::path manifest;  // <out>/manifest.json
};

// Writes <out>/<task>/ for every task (model.py, SKILL.md, model_new.py, binding.cpp,
// binding_registry.h, kernels/, utils/ with task.json), the protected files read-only and a copy
// of each under <out>/.protected/<task>/, out of the agent's reach. The same tasks and templates
// give the same bytes. Throws opforge::Error naming what is wrong (no tasks, an unknown
// placeholder, missing templates). A second export over the same --out rewrites its folders.
EnvExportResult export_envs(const EnvExportOptions& o);

// What the agent changed among the protected files of <out>/<task> ("model.py", "utils/judge.py"
// ...: edited, removed or made writable), against the copies export kept. Empty: intact.
std::vector<std::string> changed_protected(const std::filesystem::path& out, const std::string& task);

// <out>/<folder> as export wrote it, whatever was in it before (a resumed episode starts afresh).
void reset_folder(const std::filesystem::path& out, const std::string& folder, const std::string& task_id,
                  const std::string& name, const std::string& code, const std::filesystem::path& data_dir);

// The folders of <out>/manifest.json.
std::vector<std::string> exported_folders(const std::filesystem::path& out);

// The protected files of a working folder, relative to it.
const std::vector<std::string>& protected_files();

}  // namespace opforge::agent

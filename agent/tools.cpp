// The agent's tools (tools.h). Paths are the folder's own: relative, or absolute under /work (the
// sandbox's name for it); nothing outside the folder is read or written, symlinks included.
#include "tools.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "env.h"
#include "opforge/core/files.h"
#include "shell.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace opforge::agent {

namespace {

constexpr std::size_t kMaxWriteBytes = 1u << 20;  // what serve accepts of a whole submission

json function(const std::string& name, const std::string& what, json props, json required) {
  return {{"type", "function"},
          {"function",
           {{"name", name},
            {"description", what},
            {"parameters", {{"type", "object"}, {"properties", std::move(props)}, {"required", std::move(required)}}}}}};
}

ToolOutcome refused(const std::string& why) { return {"error: " + why, false, false, json::object()}; }

// The folder's file named by `rel`, or why not.
std::optional<fs::path> inside(const fs::path& folder, std::string rel, std::string& why) {
  if (rel.rfind("/work/", 0) == 0) rel = rel.substr(6);
  if (rel.empty() || rel[0] == '/') {
    why = fmt::format("path {:?} is outside your folder: give it relative to the folder (or under /work/)", rel);
    return std::nullopt;
  }
  fs::path root = fs::weakly_canonical(folder);
  fs::path full = fs::weakly_canonical(root / rel);  // symlinks resolved: a link out is outside
  auto r = full.lexically_relative(root);
  if (r.empty() || *r.begin() == "..") {
    why = fmt::format("path {:?} is outside your folder", rel);
    return std::nullopt;
  }
  return full;
}

std::string relative_name(const fs::path& folder, const fs::path& full) {
  return full.lexically_relative(fs::weakly_canonical(folder)).generic_string();
}

ToolOutcome read_file_tool(const ToolContext& ctx, const json& a) {
  std::string why;
  auto p = inside(ctx.folder, a.value("path", ""), why);
  if (!p) return refused(why);
  if (!fs::is_regular_file(*p)) return refused(fmt::format("{:?} is not a file of your folder", a.value("path", "")));
  std::string text = read_text(*p);
  json d = {{"bytes", text.size()}};
  if (text.size() > ctx.output_chars)
    text = text.substr(0, ctx.output_chars) + fmt::format("\n[... {} more bytes not shown ...]", text.size() - ctx.output_chars);
  return {text, true, false, d};
}

ToolOutcome write_file_tool(const ToolContext& ctx, const json& a) {
  std::string why;
  auto p = inside(ctx.folder, a.value("path", ""), why);
  if (!p) return refused(why);
  std::string rel = relative_name(ctx.folder, *p);
  const auto& prot = protected_files();
  if (std::find(prot.begin(), prot.end(), rel) != prot.end())
    return refused(fmt::format("{} is protected (read-only; the final evaluation refuses a folder whose protected "
                               "files changed): write model_new.py and kernels/ instead", rel));
  const std::string& content = a["content"].get_ref<const std::string&>();
  if (content.size() > kMaxWriteBytes) return refused("content larger than 1 MiB (the judge's limit on a whole submission)");
  std::error_code ec;
  fs::create_directories(p->parent_path(), ec);
  std::ofstream f(*p, std::ios::binary | std::ios::trunc);
  f << content;
  f.close();
  if (!f.good()) return refused(fmt::format("cannot write {}", rel));
  return {fmt::format("wrote {} ({} bytes)", rel, content.size()), true, false, {{"bytes", content.size()}}};
}

ToolOutcome bash_tool(const ToolContext& ctx, const json& a) {
  ShellRequest req{a["command"].get<std::string>(), ctx.folder, ctx.ro, ctx.env, ctx.bash_timeout_s,
                   ctx.output_chars, 8192, ctx.no_sandbox, ctx.judge};
  ctx.judged->clear();
  ShellResult r = run_shell(req);
  json d = {{"exit_code", r.exit_code}, {"timed_out", r.timed_out}, {"output_bytes", r.output_bytes},
            {"seconds", r.seconds}, {"judge_requests", r.judge_requests}, {"judge_seconds", r.judge_seconds},
            {"judged", *ctx.judged}};
  return {shell_report(r, ctx.bash_timeout_s), true, false, d};
}

// The arguments, or why they cannot be used: a JSON object with the tool's string fields.
std::optional<json> parse_arguments(const std::string& text, const std::vector<std::string>& fields, std::string& why) {
  json a = json::parse(text.empty() ? "{}" : text, nullptr, false);
  if (a.is_discarded() || !a.is_object()) {
    why = fmt::format("the arguments are not a JSON object: {}", text.substr(0, 200));
    return std::nullopt;
  }
  for (auto& f : fields)
    if (!a.contains(f) || !a[f].is_string()) {
      why = fmt::format("argument {:?} (a string) is missing", f);
      return std::nullopt;
    }
  return a;
}

}  // namespace

json tool_definitions() {
  json str = {{"type", "string"}};
  return json::array(
      {function("bash", "Run a bash command in your working folder (a sandbox: the folder is writable, no network). "
                        "Output is truncated; the command has a time limit.",
                {{"command", str}}, {"command"}),
       function("read_file", "Read a file of your working folder (path relative to it).", {{"path", str}}, {"path"}),
       function("write_file", "Write a file of your working folder (created or replaced; protected files refused).",
                {{"path", str}, {"content", str}}, {"path", "content"}),
       function("submit", "End the episode: the judge evaluates the folder as it is now.", json::object(),
                json::array())});
}

ToolOutcome call_tool(const ToolContext& ctx, const std::string& name, const std::string& arguments) {
  static const std::map<std::string, std::vector<std::string>> fields = {
      {"bash", {"command"}}, {"read_file", {"path"}}, {"write_file", {"path", "content"}}, {"submit", {}}};
  auto f = fields.find(name);
  if (f == fields.end()) return refused(fmt::format("unknown tool {:?}; the tools are bash, read_file, write_file, submit", name));
  std::string why;
  auto a = parse_arguments(arguments, f->second, why);
  if (!a) return refused(why);
  if (name == "bash") return bash_tool(ctx, *a);
  if (name == "read_file") return read_file_tool(ctx, *a);
  if (name == "write_file") return write_file_tool(ctx, *a);
  return {"submitted: the judge evaluates your folder now", true, true, json::object()};
}

namespace {

bool skipped_dir(const std::string& rel, const std::string& name) {
  return rel == "utils" || name[0] == '.' || name == "__pycache__";
}

bool skipped_file(const fs::directory_entry& e, const std::string& rel, const std::string& name) {
  if (!e.is_regular_file() || e.is_symlink() || rel == "model.py" || rel == "SKILL.md" || name[0] == '.') return true;
  auto ext = e.path().extension().string();
  return ext == ".pyc" || ext == ".so" || ext == ".o";
}

}  // namespace

SolutionFiles solution_files(const fs::path& folder, std::size_t max_bytes, std::size_t max_files) {
  // max_files: serve takes 256 files; a folder past it is refused there, and said so here.
  SolutionFiles s;
  std::size_t total = 0;
  try {
    auto opts = fs::directory_options::none;  // a folder it cannot enter is an error, said below
    for (auto it = fs::recursive_directory_iterator(folder, opts); it != fs::recursive_directory_iterator(); ++it) {
      std::string rel = it->path().lexically_relative(folder).generic_string();
      std::string name = it->path().filename().string();
      if (it->is_directory() && !it->is_symlink()) {
        if (skipped_dir(rel, name)) it.disable_recursion_pending();
        continue;
      }
      if (skipped_file(*it, rel, name)) continue;
      total += fs::file_size(it->path());  // before reading: a 10 GB file is never read
      if (total > max_bytes || s.files.size() >= max_files) {
        s.problem = fmt::format("the folder's solution files pass {} bytes or {} files (at {}): the judge takes "
                                "no more", max_bytes, max_files, rel);
        return s;
      }
      std::string text = read_text(it->path());
      if (!is_utf8(text)) {
        s.problem = fmt::format("{} is not UTF-8 text: a solution is source code", rel);
        return s;
      }
      s.files[rel] = std::move(text);
    }
  } catch (const std::exception& e) {
    s.problem = fmt::format("a file of the folder could not be read: {}", e.what());
  }
  return s;
}

}  // namespace opforge::agent

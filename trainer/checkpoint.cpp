#include "checkpoint.h"

#include <spdlog/spdlog.h>
#include <torch/serialize.h>

#include <fstream>

#include "files.h"
#include "opforge/core/error.h"
#include "python_bridge.h"

namespace opforge::trainer {
namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path checkpoint_dir(const fs::path& out, const std::string& part) {
  return part.empty() ? out / "checkpoint" : out / "checkpoint" / part;
}

bool has_checkpoint(const fs::path& out) {
  // A kill between save_checkpoint's two renames leaves the previous checkpoint as checkpoint.old.
  fs::path old = out / "checkpoint.old";
  if (!fs::exists(checkpoint_dir(out)) && fs::exists(old / "state.json")) fs::rename(old, checkpoint_dir(out));
  return fs::exists(checkpoint_dir(out) / "state.json");
}

void save_checkpoint(const fs::path& out, const std::vector<CheckpointPart>& parts, const TrainState& st) {
  fs::path tmp = out / "checkpoint.tmp", dir = checkpoint_dir(out);
  remove_tree(tmp);
  for (auto& p : parts) {
    fs::path d = p.name.empty() ? tmp : tmp / p.name;
    p.save_weights(d);
    torch::serialize::OutputArchive archive;
    p.optimizer->save(archive);
    archive.save_to((d / "optimizer.pt").string());
  }
  std::ofstream(tmp / "state.json") << json{{"step", st.step}, {"extra", st.extra}}.dump(2) << "\n";
  fs::path old = out / "checkpoint.old";
  remove_tree(old);
  if (fs::exists(dir)) fs::rename(dir, old);
  fs::rename(tmp, dir);
  remove_tree(old);
}

namespace {

json read_state(const fs::path& out) {
  fs::path dir = checkpoint_dir(out);
  json j = json::parse(std::ifstream(dir / "state.json"), nullptr, false);
  OPFORGE_CHECK(j.is_object() && j.contains("step"), "{}: state.json is unreadable; remove {} to start afresh",
                dir.string(), dir.string());
  return j;
}

}  // namespace

nlohmann::json checkpoint_extra(const fs::path& out) { return read_state(out).value("extra", json::object()); }

TrainState load_checkpoint(const fs::path& out, const std::vector<CheckpointPart>& parts, const char* stage) {
  fs::path dir = checkpoint_dir(out);
  json j = read_state(out);
  for (auto& p : parts) {
    torch::serialize::InputArchive archive;
    archive.load_from((checkpoint_dir(out, p.name) / "optimizer.pt").string());
    p.optimizer->load(archive);
  }
  spdlog::info("{}: resuming {} after step {}", stage, dir.string(), j["step"].get<int64_t>());
  return {j["step"].get<int64_t>(), j.value("extra", json::object())};
}

MetricsLog::MetricsLog(const fs::path& file, int64_t keep_through_step) : file_(file) {
  std::vector<std::string> kept;
  if (std::ifstream in(file); in) {
    for (std::string line; std::getline(in, line);) {
      json j = json::parse(line, nullptr, false);
      if (j.is_object() && j.value("step", int64_t{0}) <= keep_through_step) kept.push_back(line);
    }
  }
  std::ofstream out(file, std::ios::trunc);
  for (auto& l : kept) out << l << "\n";
}

void MetricsLog::plot(const fs::path& png, const std::string& title, const std::vector<std::string>& keys) const {
  call_python("opforge.train_plots", "plot", {{"metrics", file_.string()}, {"out", png.string()}, {"title", title},
                                              {"keys", keys}});
}

void MetricsLog::write(const json& row) {
  std::ofstream(file_, std::ios::app) << row.dump() << "\n";
}

}  // namespace opforge::trainer

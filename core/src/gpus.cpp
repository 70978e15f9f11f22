#include "opforge/core/gpus.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include <unistd.h>

namespace opforge {

std::vector<std::string> visible_gpus() {
  int present = 0;
  for (int i = 0; i < 64; ++i)
    if (std::filesystem::exists("/dev/nvidia" + std::to_string(i))) ++present;
  std::vector<std::string> ids;
  const char* vis = std::getenv("CUDA_VISIBLE_DEVICES");
  if (!vis) {
    for (int i = 0; i < present; ++i) ids.push_back(std::to_string(i));
    return ids;
  }
  // CUDA stops at the first entry that is neither a present index nor a UUID.
  std::stringstream in(vis);
  for (std::string e; std::getline(in, e, ',');) {
    while (!e.empty() && std::isspace(static_cast<unsigned char>(e.back()))) e.pop_back();
    while (!e.empty() && std::isspace(static_cast<unsigned char>(e.front()))) e.erase(e.begin());
    bool index = !e.empty() && std::all_of(e.begin(), e.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    if (index ? std::stoi(e) >= present : e.rfind("GPU-", 0) != 0 && e.rfind("MIG-", 0) != 0) break;
    ids.push_back(e);
  }
  return ids;
}

std::filesystem::path gpu_lock_dir() {
  if (const char* d = std::getenv("OPFORGE_LOCK_DIR"); d && *d) return d;
  return std::filesystem::temp_directory_path() / ("opforge-gpu-locks-" + std::to_string(::getuid()));
}

std::vector<std::map<std::string, std::string>> gpu_slot_env(const std::vector<std::string>& gpus, int workers,
                                                             const std::filesystem::path& cpu_lock_dir) {
  const auto lock_dir = gpus.empty() ? cpu_lock_dir : gpu_lock_dir();
  std::filesystem::create_directories(lock_dir);
  const int n = static_cast<int>(gpus.size());
  std::vector<std::map<std::string, std::string>> slots;
  for (int i = 0; i < workers; ++i) {
    if (n == 0) {
      slots.push_back({{"CUDA_VISIBLE_DEVICES", ""}, {"OPFORGE_TIMING_LOCK", (lock_dir / "cpu.lock").string()}});
      continue;
    }
    int gpu = i % n;
    slots.push_back({{"CUDA_VISIBLE_DEVICES", gpus[gpu]},
                     {"OPFORGE_TIMING_LOCK", (lock_dir / ("gpu" + gpus[gpu] + ".lock")).string()},
                     {"OPFORGE_WORKERS_ON_GPU", std::to_string((workers + n - 1 - gpu) / n)}});
  }
  return slots;
}

}  // namespace opforge

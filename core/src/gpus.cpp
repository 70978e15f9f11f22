#include "opforge/core/gpus.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <sys/stat.h>
#include <unistd.h>

#include "opforge/core/error.h"

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

std::vector<std::string> gpu_models(const std::filesystem::path& root) {
  std::vector<std::string> models;
  std::error_code ec;
  for (const auto& gpu : std::filesystem::directory_iterator(root, ec)) {
    std::ifstream in(gpu.path() / "information");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("Model:", 0) != 0) continue;
      auto b = line.find_first_not_of(" \t", 6), e = line.find_last_not_of(" \t\r");
      if (b != std::string::npos) models.push_back(line.substr(b, e - b + 1));
      break;
    }
  }
  std::sort(models.begin(), models.end());
  models.erase(std::unique(models.begin(), models.end()), models.end());
  return models;
}

namespace {

// The lock folder is made ours alone (0700) and, found already there, must be a real folder of
// ours that nobody else can write: the default lives in the shared /tmp, where another user could
// have made it first (to hold every lock, or to plant symlinks the judge would open).
void make_private_dir(const std::filesystem::path& d) {
  const std::string fix = "remove it, or set OPFORGE_LOCK_DIR to a folder of your own";
  if (::mkdir(d.c_str(), 0700) != 0 && errno != EEXIST) {
    std::filesystem::create_directories(d.parent_path());
    OPFORGE_CHECK(::mkdir(d.c_str(), 0700) == 0 || errno == EEXIST, "cannot make the GPU lock folder {}: {}",
                  d.string(), std::strerror(errno));
  }
  struct stat st {};
  OPFORGE_CHECK(::lstat(d.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "the GPU lock folder {} is not a folder (a "
                "symlink?): {}", d.string(), fix);
  OPFORGE_CHECK(st.st_uid == ::getuid(), "the GPU lock folder {} belongs to uid {}, not to you ({}): {}", d.string(),
                st.st_uid, ::getuid(), fix);
  OPFORGE_CHECK((st.st_mode & (S_IWGRP | S_IWOTH)) == 0, "the GPU lock folder {} is writable by others (mode {:o}): {}",
                d.string(), st.st_mode & 0777, fix);
}

}  // namespace

std::filesystem::path gpu_lock_dir() {
  if (const char* d = std::getenv("OPFORGE_LOCK_DIR"); d && *d) return d;
  return std::filesystem::temp_directory_path() / ("opforge-gpu-locks-" + std::to_string(::getuid()));
}

std::vector<std::map<std::string, std::string>> gpu_slot_env(const std::vector<std::string>& gpus, int workers,
                                                             const std::filesystem::path& cpu_lock_dir) {
  const auto lock_dir = gpus.empty() ? cpu_lock_dir : gpu_lock_dir();
  if (gpus.empty())
    std::filesystem::create_directories(lock_dir);
  else
    make_private_dir(lock_dir);
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

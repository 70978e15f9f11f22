// GPU discovery as CUDA reads CUDA_VISIBLE_DEVICES, so a user who restricts the GPUs gets
// workers pinned to those GPUs, not to the first N.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include <unistd.h>

#include "opforge/core/error.h"
#include "opforge/core/gpus.h"
#include "test_support.h"

namespace opforge {
namespace {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

int present() {
  int n = 0;
  while (n < 64 && std::filesystem::exists("/dev/nvidia" + std::to_string(n))) ++n;
  return n;
}

TEST(Gpus, CudaVisibleDevicesPicksAndOrdersTheGpus) {
  {
    ScopedEnv e("CUDA_VISIBLE_DEVICES", "");
    EXPECT_TRUE(visible_gpus().empty()) << "an empty list hides every GPU";
  }
  {
    ScopedEnv e("CUDA_VISIBLE_DEVICES", "-1");
    EXPECT_TRUE(visible_gpus().empty());
  }
  {
    // UUIDs are taken as they are; CUDA stops reading at the first invalid entry.
    ScopedEnv e("CUDA_VISIBLE_DEVICES", "GPU-8f1c, MIG-2a,bogus,GPU-77");
    EXPECT_EQ(visible_gpus(), (std::vector<std::string>{"GPU-8f1c", "MIG-2a"}));
  }
  {
    // An index beyond the GPUs present ends the list, as it does for CUDA.
    ScopedEnv e("CUDA_VISIBLE_DEVICES", ("0," + std::to_string(present())).c_str());
    EXPECT_EQ(visible_gpus(), present() > 0 ? std::vector<std::string>{"0"} : std::vector<std::string>{});
  }
  {
    ScopedEnv e("CUDA_VISIBLE_DEVICES", nullptr);
    EXPECT_EQ(static_cast<int>(visible_gpus().size()), present());
  }
}

TEST(Gpus, ModelsComeFromTheDriversProcFilesSortedAndOnce) {
  // The layout of /proc/driver/nvidia/gpus: one folder per PCI address, an `information` file each.
  test::TempDir root;
  auto gpu = [&](const std::string& pci, const std::string& model) {
    std::filesystem::create_directories(root / pci);
    std::ofstream(root / pci / "information") << "Model: \t " << model << " \nIRQ:   176\nGPU UUID:  GPU-1\n";
  };
  EXPECT_TRUE(gpu_models(root / "absent").empty()) << "no driver: no models, no error";
  gpu("0000:1a:00.0", "NVIDIA H200");
  gpu("0000:1b:00.0", "NVIDIA H100 80GB HBM3");
  gpu("0000:1c:00.0", "NVIDIA H200");
  std::filesystem::create_directories(root / "0000:1d:00.0");  // a folder without its file
  EXPECT_EQ(gpu_models(root.path()), (std::vector<std::string>{"NVIDIA H100 80GB HBM3", "NVIDIA H200"}));
}

TEST(Gpus, SlotsGoRoundRobinWithTheirGpusLockAndSharing) {
  auto dir = std::filesystem::temp_directory_path() / "opforge-test-gpu-slots";
  auto host = std::filesystem::temp_directory_path() / "opforge-test-gpu-host-locks";
  ScopedEnv e("OPFORGE_LOCK_DIR", host.c_str());
  auto slots = gpu_slot_env({"3", "GPU-a"}, 3, dir);
  ASSERT_EQ(slots.size(), 3u);
  EXPECT_EQ(slots[0].at("CUDA_VISIBLE_DEVICES"), "3");
  EXPECT_EQ(slots[1].at("CUDA_VISIBLE_DEVICES"), "GPU-a");
  EXPECT_EQ(slots[2].at("CUDA_VISIBLE_DEVICES"), "3");
  // The GPU's lock is the host's, not the run's: two runs on one GPU (shards) time in turn.
  EXPECT_EQ(slots[0].at("OPFORGE_TIMING_LOCK"), (host / "gpu3.lock").string());
  EXPECT_EQ(gpu_slot_env({"3"}, 1, dir / "other-run")[0].at("OPFORGE_TIMING_LOCK"), slots[0].at("OPFORGE_TIMING_LOCK"));
  EXPECT_EQ(slots[2].at("OPFORGE_TIMING_LOCK"), slots[0].at("OPFORGE_TIMING_LOCK")) << "one lock per GPU";
  EXPECT_EQ(slots[0].at("OPFORGE_WORKERS_ON_GPU"), "2");
  EXPECT_EQ(slots[1].at("OPFORGE_WORKERS_ON_GPU"), "1");
  auto cpu = gpu_slot_env({}, 2, dir);
  ASSERT_EQ(cpu.size(), 2u);
  EXPECT_EQ(cpu[1].at("CUDA_VISIBLE_DEVICES"), "");
  EXPECT_EQ(cpu[1].at("OPFORGE_TIMING_LOCK"), (dir / "cpu.lock").string());
  EXPECT_TRUE(std::filesystem::is_directory(dir));
  EXPECT_TRUE(std::filesystem::is_directory(host));
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(host);
  {
    ScopedEnv unset("OPFORGE_LOCK_DIR", nullptr);
    EXPECT_EQ(gpu_lock_dir().parent_path(), std::filesystem::temp_directory_path());
  }
}

// The host's lock folder sits in the shared /tmp by default: a folder someone else made there
// first (a symlink, another user's, one anyone can write) is refused, naming the way out.
TEST(Gpus, TheHostLockFolderIsPrivateAndAForeignOneIsRefused) {
  namespace fs = std::filesystem;
  auto base = fs::temp_directory_path() / ("opforge-test-lockdir-" + std::to_string(::getpid()));
  fs::remove_all(base);
  fs::create_directories(base);
  auto dir = base / "locks";
  auto refused = [&](const fs::path& d, const std::string& why) {
    ScopedEnv e("OPFORGE_LOCK_DIR", d.c_str());
    try {
      gpu_slot_env({"0"}, 1, base / "cpu");
      ADD_FAILURE() << d << " was taken as the lock folder; expected: " << why;
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find(why), std::string::npos) << err.what();
      EXPECT_NE(std::string(err.what()).find("OPFORGE_LOCK_DIR"), std::string::npos) << err.what();
    }
  };
  {
    ScopedEnv e("OPFORGE_LOCK_DIR", dir.c_str());
    gpu_slot_env({"0"}, 1, base / "cpu");
    EXPECT_EQ(fs::status(dir).permissions() & fs::perms::all, fs::perms::owner_all) << "made 0700";
    gpu_slot_env({"0"}, 1, base / "cpu");  // found again, ours: taken
  }
  fs::permissions(dir, fs::perms::all);
  refused(dir, "writable by others");
  fs::permissions(dir, fs::perms::owner_all);
  fs::create_directory_symlink(dir, base / "link");
  refused(base / "link", "not a folder");
  if (::getuid() == 0) {  // as root, a folder of another user can be made here
    ASSERT_EQ(::chown(dir.c_str(), 65534, 65534), 0);
    refused(dir, "belongs to uid 65534");
  }
  fs::remove_all(base);
}

}  // namespace
}  // namespace opforge

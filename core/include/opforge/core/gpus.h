// Which GPUs the stages may use, decided without a CUDA call in the supervisor (it never loads
// the driver: workers do).
#pragma once
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace opforge {

// The device ids a worker can be pinned to with CUDA_VISIBLE_DEVICES=<id>: the entries of the
// user's CUDA_VISIBLE_DEVICES when set (indices or GPU-UUIDs, in order, up to the first invalid
// one as CUDA itself reads it; empty or "-1" hides every GPU), else "0".."N-1" for the
// /dev/nvidiaN device files the driver creates.
std::vector<std::string> visible_gpus();

// The models of the host's NVIDIA GPUs ("NVIDIA H100 80GB HBM3"), sorted and unique, from the
// driver's /proc files (no CUDA call; `root` is for tests): what a GPU verdict's timings depend
// on, so the filter keeps it in its configuration and a workspace judged on one model is not
// silently continued on another. Empty where the driver exposes none.
std::vector<std::string> gpu_models(const std::filesystem::path& root = "/proc/driver/nvidia/gpus");

// Where the GPUs' timing locks live: one folder for the whole host, so that every opforge
// process on it (two shards of an array job on one GPU, a filter beside an eval) times a GPU in
// turn. OPFORGE_LOCK_DIR when set (e.g. one per Slurm job when cgroups give each job its own GPU
// under the same index), else <tmp>/opforge-gpu-locks-<uid>. gpu_slot_env makes it mode 0700 and
// refuses one that is a symlink, another user's, or writable by others (an Error saying what to do).
std::filesystem::path gpu_lock_dir();

// The environment of each of `workers` worker slots spread round-robin over `gpus` (ids from
// visible_gpus()): CUDA_VISIBLE_DEVICES pins the slot to its GPU, OPFORGE_TIMING_LOCK names the
// GPU's lock in gpu_lock_dir() (its workers compile in parallel but never time together,
// timing.py), OPFORGE_WORKERS_ON_GPU says how many slots share that GPU. With no GPU, every slot
// gets CUDA_VISIBLE_DEVICES="" and the one CPU lock in cpu_lock_dir (the run's own: CPU timings
// of parallel runs are not what a GPU corpus keeps).
std::vector<std::map<std::string, std::string>> gpu_slot_env(const std::vector<std::string>& gpus, int workers,
                                                             const std::filesystem::path& cpu_lock_dir);

}  // namespace opforge

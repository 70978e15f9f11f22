// Which GPUs the stages may use, decided without a CUDA call in the supervisor (it never loads
// the driver: workers do).
#pragma once
#include <string>
#include <vector>

namespace opforge {

// The device ids a worker can be pinned to with CUDA_VISIBLE_DEVICES=<id>: the entries of the
// user's CUDA_VISIBLE_DEVICES when set (indices or GPU-UUIDs, in order, up to the first invalid
// one as CUDA itself reads it; empty or "-1" hides every GPU), else "0".."N-1" for the
// /dev/nvidiaN device files the driver creates.
std::vector<std::string> visible_gpus();

}  // namespace opforge

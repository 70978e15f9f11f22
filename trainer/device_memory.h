// A training step's peak memory on its device, for the stages' metrics (peak_mem_gib): what tells
// whether a batch or a model still fits before the allocator says it does not.
#pragma once
#include <c10/core/Device.h>

#include <optional>

namespace opforge::trainer {

// Starts a new peak on a CUDA device (the caching allocator's counters); nothing on the CPU.
void reset_peak_memory(const c10::Device& device);
// GiB of tensors the caching allocator held at most since reset_peak_memory (as
// torch.cuda.max_memory_allocated counts them); nullopt on the CPU, which has no such counter.
std::optional<double> peak_memory_gib(const c10::Device& device);

}  // namespace opforge::trainer

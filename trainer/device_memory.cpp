#include "device_memory.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

namespace opforge::trainer {

namespace {
c10::DeviceIndex index_of(const c10::Device& d) { return d.has_index() ? d.index() : c10::cuda::current_device(); }
}  // namespace

void reset_peak_memory(const c10::Device& device) {
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(index_of(device));
}

std::optional<double> peak_memory_gib(const c10::Device& device) {
  if (!device.is_cuda()) return std::nullopt;
  auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index_of(device));
  auto all = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  return static_cast<double>(stats.allocated_bytes[all].peak) / static_cast<double>(1ULL << 30);
}

}  // namespace opforge::trainer

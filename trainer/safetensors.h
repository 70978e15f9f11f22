// Reading and writing the safetensors format (a little-endian u64 header length, a JSON header
// naming each tensor's dtype, shape and byte range, then the raw bytes), the format Hugging Face
// checkpoints use. Hand-written because no Debian package ships a C++ reader; the format is small
// and fully specified (huggingface/safetensors, "Format").
//
// Errors: a missing file, a header that does not parse, a dtype other than F32/F16/BF16/I64/I32,
// or a byte range outside the file throws opforge::Error naming the file and the tensor.
#pragma once
#include <ATen/ATen.h>

#include <filesystem>
#include <map>
#include <string>

namespace opforge::trainer {

// Every tensor of one file, on the CPU, in its stored dtype (the caller converts).
std::map<std::string, at::Tensor> read_safetensors(const std::filesystem::path& file);

// Every tensor of a checkpoint folder: model.safetensors, or the shards listed by
// model.safetensors.index.json.
std::map<std::string, at::Tensor> read_checkpoint(const std::filesystem::path& dir);

// Writes `tensors` (moved to the CPU, made contiguous) into one file, names sorted, with a
// {"format": "pt"} metadata entry as transformers writes it. Written to a temporary name and
// renamed, so a kill never leaves a truncated checkpoint.
void write_safetensors(const std::filesystem::path& file, const std::map<std::string, at::Tensor>& tensors);

}  // namespace opforge::trainer

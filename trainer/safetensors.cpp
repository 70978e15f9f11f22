#include "safetensors.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>
#include <vector>

#include "opforge/core/error.h"

namespace opforge::trainer {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const std::map<std::string, at::ScalarType>& dtypes() {
  static const std::map<std::string, at::ScalarType> m = {
      {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16}, {"I64", at::kLong}, {"I32", at::kInt}};
  return m;
}

std::string dtype_name(at::ScalarType t) {
  for (auto& [name, type] : dtypes())
    if (type == t) return name;
  throw Error(fmt::format("safetensors: cannot write dtype {} (F32, F16, BF16, I64, I32 only)", c10::toString(t)));
}

// One read into a buffer of the file's size: through istreambuf_iterator, byte by byte, a 2 GB
// checkpoint took 4.2 s of a model's 7.5 s load (1.6 s this way).
std::vector<char> read_all(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  OPFORGE_CHECK(in, "cannot open {}: check the model folder", file.string());
  std::vector<char> bytes(fs::file_size(file));
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  OPFORGE_CHECK(in.gcount() == static_cast<std::streamsize>(bytes.size()), "{}: read {} of its {} bytes",
                file.string(), in.gcount(), bytes.size());
  return bytes;
}

}  // namespace

std::map<std::string, at::Tensor> read_safetensors(const fs::path& file) {
  std::vector<char> bytes = read_all(file);
  OPFORGE_CHECK(bytes.size() >= 8, "{} is not a safetensors file (shorter than its header length)", file.string());
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);  // little-endian, as every machine opforge runs on
  OPFORGE_CHECK(n <= bytes.size() - 8, "{}: header length {} is past the end of the file", file.string(), n);
  json header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n), nullptr, false);
  OPFORGE_CHECK(header.is_object(), "{}: the header is not a JSON object", file.string());
  const std::size_t base = 8 + n;
  std::map<std::string, at::Tensor> out;
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    std::string dt = info.value("dtype", "");
    auto it = dtypes().find(dt);
    OPFORGE_CHECK(it != dtypes().end(), "{}: tensor {} has dtype {} (opforge reads F32, F16, BF16, I64, I32)",
                  file.string(), name, dt);
    std::vector<int64_t> shape = info.at("shape").get<std::vector<int64_t>>();
    auto range = info.at("data_offsets").get<std::vector<std::uint64_t>>();
    auto t = at::empty(shape, at::TensorOptions().dtype(it->second));
    std::uint64_t need = static_cast<std::uint64_t>(t.numel()) * t.element_size();
    OPFORGE_CHECK(range.size() == 2 && range[1] - range[0] == need && base + range[1] <= bytes.size(),
                  "{}: tensor {}'s byte range does not match its shape or lies past the end of the file",
                  file.string(), name);
    std::memcpy(t.data_ptr(), bytes.data() + base + range[0], need);
    out.emplace(name, std::move(t));
  }
  return out;
}

std::map<std::string, at::Tensor> read_checkpoint(const fs::path& dir) {
  if (fs::exists(dir / "model.safetensors")) return read_safetensors(dir / "model.safetensors");
  fs::path index = dir / "model.safetensors.index.json";
  OPFORGE_CHECK(fs::exists(index), "{} has neither model.safetensors nor model.safetensors.index.json: a Hugging "
                "Face model folder saved with safetensors is needed", dir.string());
  json idx = json::parse(std::ifstream(index), nullptr, false);
  OPFORGE_CHECK(idx.is_object() && idx.contains("weight_map"), "{}: no weight_map", index.string());
  std::set<std::string> shards;
  for (auto& [_, shard] : idx["weight_map"].items()) shards.insert(shard.get<std::string>());
  std::map<std::string, at::Tensor> out;
  for (auto& s : shards) out.merge(read_safetensors(dir / s));
  return out;
}

void write_safetensors(const fs::path& file, const std::map<std::string, at::Tensor>& tensors) {
  json header = {{"__metadata__", {{"format", "pt"}}}};
  std::vector<at::Tensor> data;
  std::uint64_t offset = 0;
  for (auto& [name, t] : tensors) {
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    std::uint64_t nb = static_cast<std::uint64_t>(c.numel()) * c.element_size();
    header[name] = {{"dtype", dtype_name(c.scalar_type())}, {"shape", c.sizes().vec()}, {"data_offsets", {offset, offset + nb}}};
    offset += nb;
    data.push_back(std::move(c));
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // the format pads the header to 8 bytes with spaces
  fs::path tmp = file;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    OPFORGE_CHECK(out, "cannot write {}", tmp.string());
    std::uint64_t n = h.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(h.data(), static_cast<std::streamsize>(h.size()));
    for (auto& c : data) out.write(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
    OPFORGE_CHECK(out.good(), "writing {} failed (disk full?)", tmp.string());
  }
  fs::rename(tmp, file);
}

}  // namespace opforge::trainer

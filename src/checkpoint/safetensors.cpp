#include "checkpoint/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"
#include "core/json_integer.h"

namespace meshtrain::checkpoint {

namespace {

constexpr std::pair<std::string_view, DType> kNames[] = {
    {"F32", DType::f32}, {"F64", DType::f64}, {"BF16", DType::bf16},      {"F16", DType::f16},
    {"I32", DType::i32}, {"I64", DType::i64}, {"F8_E4M3", DType::f8e4m3}, {"F8_E5M2", DType::f8e5m2}};

DType dtype_from(const std::string& name, const std::string& path, const std::string& tensor) {
  for (const auto& [n, t] : kNames)
    if (n == name) return t;
  throw InvalidArgument(fmt::format("{}: tensor '{}' has unsupported dtype '{}'", path, tensor, name));
}

std::string_view name_of(DType t) {
  for (const auto& [n, d] : kNames)
    if (d == t) return n;
  return "?";
}

}  // namespace

std::map<std::string, Tensor> load_safetensors(const std::string& path) {
  MT_CHECK(std::filesystem::exists(path), "safetensors file '{}' does not exist", path);
  MT_CHECK(std::filesystem::is_regular_file(path), "'{}' is not a file; a safetensors file was expected", path);
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in.good(), "cannot open safetensors file '{}': {}", path, std::strerror(errno));
  const auto file_size = static_cast<uint64_t>(std::filesystem::file_size(path));
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  MT_CHECK(in.good() && header_len <= file_size - 8, "{}: not a safetensors file (header length {} in a {}-byte file)",
           path, header_len, file_size);
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(fmt::format("{}: the header is not valid JSON: {}", path, json_error_text(e)));
  }
  const uint64_t data_start = 8 + header_len;
  MT_CHECK(j.is_object(), "{}: the header is not a JSON object of tensors", path);
  std::map<std::string, Tensor> tensors;
  struct Extent {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Extent> extents;  // where each tensor's bytes lie, to find two that share bytes
  for (const auto& [name, info] : j.items()) {
    if (name == "__metadata__") continue;
    std::string dtype_name;
    std::vector<int64_t> dims, offset_list;
    try {
      MT_CHECK(info.is_object() && info.contains("dtype") && info["dtype"].is_string(),
               "it needs a \"dtype\" string, a \"shape\" and \"data_offsets\"");
      dtype_name = info["dtype"].get<std::string>();
      dims = json_integer_list(info, "shape", 0, Shape::kMaxElements);
      offset_list = json_integer_list(info, "data_offsets", 0, std::numeric_limits<int64_t>::max());
    } catch (const InternalError&) {
      throw;  // a bug, not a malformed file
    } catch (const std::exception& e) {
      throw InvalidArgument(
          fmt::format("{}: tensor '{}' has a malformed header entry: {}", path, name, json_error_text(e)));
    }
    {
      const DType dtype = dtype_from(dtype_name, path, name);
      Shape shape;
      try {
        shape = Shape(dims);
      } catch (const InvalidArgument& e) {
        throw InvalidArgument(fmt::format("{}: tensor '{}' has an impossible shape: {}", path, name, e.what()));
      }
      MT_CHECK(offset_list.size() == 2 && offset_list[0] <= offset_list[1],
               "{}: tensor '{}' has bad data_offsets (two byte offsets, begin <= end)", path, name);
      const std::vector<uint64_t> offsets(offset_list.begin(), offset_list.end());
      const uint64_t bytes = offsets[1] - offsets[0];
      MT_CHECK(bytes == static_cast<uint64_t>(shape.numel()) * dtype_size(dtype),
               "{}: tensor '{}' {} needs {} bytes but data_offsets span {}", path, name, shape.to_string(),
               shape.numel() * static_cast<int64_t>(dtype_size(dtype)), bytes);
      MT_CHECK(offsets[1] <= file_size - data_start,
               "{}: tensor '{}' ends at byte {} of the data but the file holds {} bytes of data (truncated?)", path,
               name, offsets[1], file_size - data_start);
      if (bytes > 0) extents.push_back({offsets[0], offsets[1], name});
      Tensor t = Tensor::empty(shape, dtype);
      in.seekg(static_cast<std::streamoff>(data_start + offsets[0]));
      in.read(static_cast<char*>(t.raw()), static_cast<std::streamsize>(bytes));
      MT_CHECK(in.good(), "{}: could not read tensor '{}'", path, name);
      tensors.emplace(name, std::move(t));
    }
  }
  std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < extents.size(); ++i)
    MT_CHECK(extents[i].begin >= extents[i - 1].end, "{}: tensors '{}' and '{}' overlap (data bytes {}..{} and {}..{})",
             path, extents[i - 1].name, extents[i].name, extents[i - 1].begin, extents[i - 1].end, extents[i].begin,
             extents[i].end);
  return tensors;
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::function<void(std::string_view)>& written) {
  nlohmann::ordered_json header;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    header[name] = {
        {"dtype", name_of(t.dtype())}, {"shape", t.shape().dims()}, {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');  // the format pads the header to 8 bytes
  AtomicFile out(path);
  const auto put = [&](const void* data, size_t bytes) {
    out.write(data, bytes);
    if (written) written({static_cast<const char*>(data), bytes});
  };
  const uint64_t len = text.size();
  put(&len, 8);
  put(text.data(), text.size());
  for (const auto& [name, t] : tensors) put(t.raw(), t.nbytes());
  out.commit();
}

}  // namespace meshtrain::checkpoint

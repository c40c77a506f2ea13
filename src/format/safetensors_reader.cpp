#include "format/safetensors_reader.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/read_file.h"
#include "format/name_util.h"

namespace frink::safetensors {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;  // keeps the header's tensor order

namespace {

// The safetensors crate refuses headers above 100 MB (MAX_HEADER_SIZE).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

GgmlType dtype_to_ggml(const std::string& dtype, const std::string& name, const std::string& tensor) {
  if (dtype == "F32") return GgmlType::F32;
  if (dtype == "F16") return GgmlType::F16;
  if (dtype == "BF16") return GgmlType::BF16;
  fail("{}: tensor {} has dtype {}, which frink does not read (F32, F16, BF16 only)", name,
       printable(tensor), printable(dtype));
}

Json parse_json(const char* begin, const char* end, const std::string& name) {
  try {
    return Json::parse(begin, end);
  } catch (const Json::exception& e) {
    fail("broken JSON in {}: {}", name, e.what());
  }
}

uint64_t as_u64(const Json& j, const std::string& name, const std::string& tensor, const char* what) {
  if (!j.is_number_unsigned() && !(j.is_number_integer() && j.get<int64_t>() >= 0))
    fail("{}: tensor {} has a {} that is not a non-negative integer", name, printable(tensor), what);
  return j.get<uint64_t>();
}

struct Entry {
  TensorView view;
  uint64_t begin, end;
};

Entry read_entry(const std::string& tensor, const Json& j, const std::string& name) {
  if (!j.is_object()) fail("{}: header entry {} is not an object", name, printable(tensor));
  auto dt = j.find("dtype");
  auto shape = j.find("shape");
  auto offs = j.find("data_offsets");
  if (dt == j.end() || !dt->is_string() || shape == j.end() || !shape->is_array() ||
      offs == j.end() || !offs->is_array() || offs->size() != 2)
    fail("{}: tensor {} needs a string dtype, an array shape and two data_offsets", name,
         printable(tensor));
  Entry e;
  e.view.name = tensor;
  e.view.type = dtype_to_ggml(dt->get<std::string>(), name, tensor);
  if (shape->size() > 4)
    fail("{}: tensor {} has {} dimensions (at most 4)", name, printable(tensor), shape->size());
  int64_t n_elems = 1;
  for (auto it = shape->rbegin(); it != shape->rend(); ++it) {  // reversed: ne[0] innermost
    uint64_t d = as_u64(*it, name, tensor, "dimension");
    if (d == 0 || d > static_cast<uint64_t>(INT64_MAX))
      fail("{}: tensor {} has a dimension of {}", name, printable(tensor), d);
    if (__builtin_mul_overflow(n_elems, static_cast<int64_t>(d), &n_elems))
      fail("{}: tensor {} has an element count that overflows", name, printable(tensor));
    e.view.ne.push_back(static_cast<int64_t>(d));
  }
  if (e.view.ne.empty()) e.view.ne.push_back(1);
  e.begin = as_u64((*offs)[0], name, tensor, "data offset");
  e.end = as_u64((*offs)[1], name, tensor, "data offset");
  size_t elem_bytes = ggml_type_info(e.view.type).block_bytes;
  uint64_t want = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(n_elems), elem_bytes, &want) || e.end < e.begin ||
      e.end - e.begin != want)
    fail("{}: tensor {} data_offsets [{}, {}) do not hold its {} elements", name, printable(tensor),
         e.begin, e.end, n_elems);
  e.view.n_bytes = static_cast<size_t>(want);
  return e;
}

void load_config(const fs::path& dir, ModelFile& out) {
  fs::path cfg = dir / "config.json";
  std::error_code ec;
  out.set_hf(dir.string(), fs::is_regular_file(cfg, ec) ? read_file(cfg) : std::string());
}

void open_file(const std::string& path, ModelFile& out, std::unordered_set<std::string>& seen) {
  auto f = std::make_unique<MappedFile>(path);
  std::vector<TensorView>& tensors = out.mutable_tensors();
  size_t first = tensors.size();
  parse(f->data(), f->size(), path, tensors, out.mutable_metadata());
  for (size_t i = first; i < tensors.size(); ++i)
    if (!seen.insert(tensors[i].name).second)
      fail("{}: tensor {} also appears in another shard", path, printable(tensors[i].name));
  out.keep_mapping(std::move(f));
}

void open_index(const std::string& index_path, ModelFile& out) {
  std::string text = read_file(index_path);
  Json j = parse_json(text.data(), text.data() + text.size(), index_path);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    fail("{}: no weight_map object", index_path);
  fs::path dir = fs::path(index_path).parent_path();
  std::vector<std::string> shards;
  for (auto& [tensor, file] : j["weight_map"].items()) {
    if (!file.is_string()) fail("{}: weight_map entry {} is not a file name", index_path, printable(tensor));
    std::string s = file.get<std::string>();
    if (s.empty() || s.find('/') != std::string::npos || s == "." || s == "..")
      fail("{}: weight_map names shard {}, not a file in the same folder", index_path, printable(s));
    if (std::find(shards.begin(), shards.end(), s) == shards.end()) shards.push_back(s);
  }
  if (shards.empty()) fail("{}: weight_map is empty", index_path);
  std::unordered_set<std::string> seen;
  for (const auto& s : shards) open_file((dir / s).string(), out, seen);
  for (auto& [tensor, file] : j["weight_map"].items()) {
    const TensorView* t = out.find(tensor);
    if (!t) fail("{}: tensor {} is not in shard {}", index_path, printable(tensor), file.get<std::string>());
  }
}

}  // namespace

void parse(const uint8_t* data, size_t n_bytes, const std::string& name, std::vector<TensorView>& out,
           Metadata& meta) {
  if (n_bytes < 8) fail("{}: too short for a SafeTensors header ({} bytes)", name, n_bytes);
  uint64_t header_bytes;
  std::memcpy(&header_bytes, data, 8);
  if (header_bytes > n_bytes - 8)
    fail("{}: header length {} runs past the end of the file ({} bytes)", name, header_bytes, n_bytes);
  if (header_bytes > kMaxHeaderBytes)
    fail("{}: header length {} is above the 100 MB limit", name, header_bytes);
  const char* hb = reinterpret_cast<const char*>(data + 8);
  Json header = parse_json(hb, hb + header_bytes, name);
  if (!header.is_object()) fail("{}: the header is not a JSON object", name);
  const size_t data_begin = 8 + static_cast<size_t>(header_bytes);
  const size_t data_bytes = n_bytes - data_begin;
  std::vector<Entry> entries;
  for (auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) fail("{}: __metadata__ is not a JSON object", name);
      for (auto& [k, v] : value.items()) {
        if (!v.is_string()) fail("{}: __metadata__ value of {} is not a string", name, printable(k));
        meta.set("safetensors." + k, MetaValue::of_string(v.get<std::string>()));
      }
      continue;
    }
    entries.push_back(read_entry(key, value, name));
    Entry& e = entries.back();
    if (e.end > data_bytes)
      fail("{}: tensor {} data_offsets [{}, {}) run past the {}-byte data section", name,
           printable(key), e.begin, e.end, data_bytes);
    e.view.data = data + data_begin + e.begin;
  }
  std::vector<const Entry*> sorted;
  for (const auto& e : entries) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(), [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i - 1]->end > sorted[i]->begin)
      fail("{}: tensors {} and {} overlap", name, printable(sorted[i - 1]->view.name),
           printable(sorted[i]->view.name));
  for (auto& e : entries) out.push_back(std::move(e.view));
}

void open(const std::string& path, ModelFile& out) {
  out.set_source(FileFormat::kSafeTensors, path);
  load_config(fs::path(path).parent_path(), out);
  if (path.size() >= 11 && path.substr(path.size() - 11) == ".index.json") {
    open_index(path, out);
    return;
  }
  std::unordered_set<std::string> seen;
  open_file(path, out, seen);
}

void open_folder(const std::string& dir, ModelFile& out) {
  fs::path d(dir);
  std::error_code ec;
  if (fs::is_regular_file(d / "model.safetensors.index.json", ec)) {
    open((d / "model.safetensors.index.json").string(), out);
  } else if (fs::is_regular_file(d / "model.safetensors", ec)) {
    open((d / "model.safetensors").string(), out);
  } else {
    fail("{}: folder has neither model.safetensors nor model.safetensors.index.json", dir);
  }
  out.set_source(FileFormat::kSafeTensors, dir);
}

}  // namespace frink::safetensors

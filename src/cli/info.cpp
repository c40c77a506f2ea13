// frink info MODEL: what a model file holds, read from the file alone. The facts are gathered
// into one JSON object (metadata_facts) and printed either as text or, with --json, as JSON,
// so the two outputs cannot disagree. When frink can run the model, the per-layer plan is
// added; when it cannot (a vocabulary-only file, an architecture frink does not run), the
// reason is shown instead and the file's facts are still printed.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <map>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "format/model_file.h"
#include "model/describe.h"
#include "model/model.h"

namespace frink::cli {

namespace {

using Json = nlohmann::ordered_json;

std::string human_count(int64_t n) {
  if (n >= 1'000'000'000'000) return fmt::format("{:.2f} T", double(n) / 1e12);
  if (n >= 1'000'000'000) return fmt::format("{:.2f} B", double(n) / 1e9);
  if (n >= 1'000'000) return fmt::format("{:.2f} M", double(n) / 1e6);
  if (n >= 1'000) return fmt::format("{:.2f} K", double(n) / 1e3);
  return std::to_string(n);
}

std::string human_bytes(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(n);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  return u == 0 ? fmt::format("{} B", n) : fmt::format("{:.2f} {}", v, units[u]);
}

// An integer key, or a per-layer integer array (shown whole unless all entries agree).
Json int_or_array(const Metadata& m, const std::string& key) {
  const MetaValue* v = m.find(key);
  if (!v) return nullptr;
  if (v->is_integer()) return v->as_int();
  if (v->is_array() && v->size() > 0 && v->as_array()[0].is_integer()) {
    auto xs = v->as_ints();
    bool same = std::all_of(xs.begin(), xs.end(), [&](int64_t x) { return x == xs[0]; });
    return same ? Json(xs[0]) : Json(xs);
  }
  return nullptr;
}

// GGUF facts with llama.cpp's keys (<arch>.context_length, ...).
void gguf_facts(const ModelFile& mf, Json& j) {
  const Metadata& m = mf.metadata();
  std::string arch = m.try_string("general.architecture").value_or("");
  j["architecture"] = arch.empty() ? Json(nullptr) : Json(arch);
  j["name"] = m.has("general.name") ? Json(m.get_string("general.name")) : Json(nullptr);
  j["context_length"] = int_or_array(m, arch + ".context_length");
  j["layers"] = int_or_array(m, arch + ".block_count");
  j["embedding_size"] = int_or_array(m, arch + ".embedding_length");
  j["heads"] = int_or_array(m, arch + ".attention.head_count");
  j["kv_heads"] = int_or_array(m, arch + ".attention.head_count_kv");
  Json vocab = int_or_array(m, arch + ".vocab_size");
  if (vocab.is_null() && m.has("tokenizer.ggml.tokens") && m.get("tokenizer.ggml.tokens").is_array())
    vocab = m.get("tokenizer.ggml.tokens").size();
  j["vocab_size"] = vocab;
}

// SafeTensors facts from config.json with transformers' names.
void hf_facts(const ModelFile& mf, Json& j) {
  Json cfg = Json::parse(mf.hf_config_json(), nullptr, /*allow_exceptions=*/false);
  if (cfg.is_discarded() || !cfg.is_object()) cfg = Json::object();
  if (cfg.contains("text_config") && cfg["text_config"].is_object()) cfg = cfg["text_config"];
  auto get = [&](const char* key) { return cfg.contains(key) ? cfg[key] : Json(nullptr); };
  j["architecture"] = get("model_type");
  j["name"] = get("_name_or_path");
  j["context_length"] = get("max_position_embeddings");
  j["layers"] = get("num_hidden_layers");
  j["embedding_size"] = get("hidden_size");
  j["heads"] = get("num_attention_heads");
  j["kv_heads"] = get("num_key_value_heads");
  j["vocab_size"] = get("vocab_size");
}

// Facts read from the file's metadata and tensor table alone: format, architecture, sizes,
// tensor types. Keys are stable (the --json output is an interface); absent facts are null.
Json metadata_facts(const ModelFile& mf) {
  Json j;
  j["path"] = mf.path();
  j["format"] = mf.format() == FileFormat::kGguf ? "GGUF" : "SafeTensors";
  if (mf.format() == FileFormat::kGguf) j["gguf_version"] = mf.gguf_version();
  j["n_files"] = mf.n_files();
  j["file_bytes"] = mf.file_bytes();
  if (mf.format() == FileFormat::kGguf) gguf_facts(mf, j); else hf_facts(mf, j);
  int64_t n_params = 0;
  std::map<std::string, std::pair<int64_t, uint64_t>> by_type;  // name -> (count, bytes)
  for (const auto& t : mf.tensors()) {
    n_params += t.n_elements();
    auto& [count, bytes] = by_type[std::string(ggml_type_name(t.type))];
    ++count;
    bytes += t.n_bytes;
  }
  j["n_tensors"] = mf.tensors().size();
  j["n_parameters"] = n_params;
  j["n_metadata_keys"] = mf.metadata().entries().size();
  Json types = Json::array();
  for (const auto& [name, cb] : by_type)
    types.push_back({{"type", name}, {"count", cb.first}, {"bytes", cb.second}});
  j["tensor_types"] = types;
  return j;
}

std::string show(const Json& v) {
  if (v.is_null()) return "-";
  if (v.is_string()) return v.get<std::string>();
  return v.dump(-1, ' ', false, Json::error_handler_t::replace);
}

void print_metadata_facts(const Json& j) {
  std::string fmt_line = j["format"].get<std::string>();
  if (j.contains("gguf_version")) fmt_line += fmt::format(" v{}", j["gguf_version"].get<int>());
  auto row = [](const char* label, const std::string& value) { fmt::print("{:<16}{}\n", label, value); };
  row("file:", j["path"].get<std::string>());
  row("format:", fmt_line);
  size_t n_files = j["n_files"].get<size_t>();
  row("file size:", human_bytes(j["file_bytes"].get<uint64_t>()) +
                        (n_files > 1 ? fmt::format(" in {} files", n_files) : ""));
  row("architecture:", show(j["architecture"]));
  if (!j["name"].is_null()) row("name:", show(j["name"]));
  int64_t n_params = j["n_parameters"].get<int64_t>();
  row("parameters:", fmt::format("{} ({})", human_count(n_params), n_params));
  row("context length:", show(j["context_length"]));
  row("layers:", show(j["layers"]));
  row("embedding size:", show(j["embedding_size"]));
  row("heads:", show(j["heads"]));
  row("kv heads:", show(j["kv_heads"]));
  row("vocabulary:", show(j["vocab_size"]));
  row("metadata keys:", show(j["n_metadata_keys"]));
  row("tensors:", show(j["n_tensors"]));
  if (j.contains("plan")) {
    fmt::print("\nlayer plan:\n");
    for (const auto& line : j["plan"]) fmt::print("  {}\n", line.get<std::string>());
  } else if (j.contains("not_runnable")) {
    row("runnable:", "no: " + j["not_runnable"].get<std::string>());
  }
  if (j["tensor_types"].empty()) return;
  fmt::print("\n  {:<8} {:>7} {:>12}\n", "type", "count", "bytes");
  for (const auto& t : j["tensor_types"])
    fmt::print("  {:<8} {:>7} {:>12}\n", t["type"].get<std::string>(), t["count"].get<int64_t>(),
               human_bytes(t["bytes"].get<uint64_t>()));
}

}  // namespace

Runner add_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Describe a model file: format, architecture, sizes, tensor types");
  struct Options {
    std::string model;
    bool json = false;
  };
  auto opt = std::make_shared<Options>();
  cmd->add_option("model", opt->model, "a .gguf file (part 1 of a split model), .safetensors file or folder")
      ->required();
  cmd->add_flag("--json", opt->json, "print the facts as one JSON object");
  return [opt]() {
    Json facts;
    try {
      auto m = load_model(opt->model);
      facts = metadata_facts(*m->file);
      facts["plan"] = describe_plan(m->hp);
    } catch (const Error& e) {
      auto mf = ModelFile::open(opt->model);  // a file that does not parse fails here, as it should
      facts = metadata_facts(*mf);
      facts["not_runnable"] = e.what();
    }
    if (opt->json)
      fmt::print("{}\n", facts.dump(2, ' ', false, Json::error_handler_t::replace));
    else
      print_metadata_facts(facts);
    return 0;
  };
}

}  // namespace frink::cli

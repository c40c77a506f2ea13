#include "model/weights.h"

#include <fmt/format.h>

#include "core/error.h"
#include "quant/quant.h"

namespace frink {

std::string blk(int64_t layer, const char* what) { return fmt::format("blk.{}.{}", layer, what); }

namespace {
std::string shape_str(const std::vector<int64_t>& ne) { return fmt::format("{{{}}}", fmt::join(ne, ", ")); }
}  // namespace

const TensorView* WeightLoader::matrix(const std::string& name, std::vector<int64_t> shape,
                                       bool required) {
  const TensorView* t = file_.find(name);
  if (!t) {
    if (required) fail("{}: required tensor '{}' is missing", file_.path(), name);
    return nullptr;
  }
  std::vector<int64_t> ne = t->ne;
  while (ne.size() > shape.size() && ne.back() == 1) ne.pop_back();
  // A stack of one ({n_in, n_out, 1}) is stored 2-D by llama.cpp's writer.
  while (shape.size() > ne.size() && shape.back() == 1) shape.pop_back();
  if (ne != shape)
    fail("{}: tensor '{}' has shape {}, expected {}", file_.path(), name, shape_str(t->ne), shape_str(shape));
  if (!host_supports(t->type))
    fail("{}: tensor '{}' has type {}, which frink cannot compute with", file_.path(), name,
         ggml_type_name(t->type));
  return t;
}

const float* WeightLoader::vector(const std::string& name, int64_t n, bool required) {
  const TensorView* t = matrix(name, {n}, required);
  if (!t) return nullptr;
  if (t->type == GgmlType::F32) return reinterpret_cast<const float*>(t->data);
  auto& buf = out_.owned.emplace_back(static_cast<size_t>(n));
  dequantize_row(t->type, t->data, buf.data(), n);
  return buf.data();
}

Norm WeightLoader::norm(const std::string& base, int64_t n, bool with_bias, bool required) {
  Norm nm;
  nm.w = vector(base + ".weight", n, required);
  if (nm.w && with_bias) nm.b = vector(base + ".bias", n, required);
  return nm;
}

Linear WeightLoader::linear(const std::string& base, int64_t n_in, int64_t n_out, LinearOpts opts) {
  Linear l;
  l.w = matrix(base + ".weight", {n_in, n_out}, opts.required);
  if (!l.w) return l;
  if (opts.bias) l.b = vector(base + ".bias", n_out, false);
  if (opts.scale) l.scale = scalar(base + ".scale", 1.0f);
  l.bias_before_scale = opts.ffn;
  return l;
}

Experts WeightLoader::experts(const std::string& base, int64_t n_in, int64_t n_out, int64_t n_expert,
                             LinearOpts opts) {
  Experts x;
  x.w = matrix(base + ".weight", {n_in, n_out, n_expert}, opts.required);
  if (!x.w) return x;
  if (opts.bias) {
    // {n_out, n_expert}: one bias row per expert, read (and widened when 16-bit) as one vector.
    if (const TensorView* t = matrix(base + ".bias", {n_out, n_expert}, false)) {
      if (t->type == GgmlType::F32) {
        x.b = reinterpret_cast<const float*>(t->data);
      } else {
        auto& buf = out_.owned.emplace_back(static_cast<size_t>(n_out * n_expert));
        dequantize_row(t->type, t->data, buf.data(), n_out * n_expert);
        x.b = buf.data();
      }
    }
  }
  if (opts.scale) x.scale = vector(base + ".scale", n_expert, false);
  return x;
}

float WeightLoader::scalar(const std::string& name, float fallback) {
  const float* v = vector(name, 1, false);
  return v ? v[0] : fallback;
}

}  // namespace frink

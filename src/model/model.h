// A loaded model: the mapped file, its hyper-parameters and layer plan, and the weight
// views. Architectures register here (src/model/arch_*.cpp, one file per family); this is
// frink's only place that branches on the architecture's name. Everything above reads the
// plan.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "format/model_file.h"
#include "model/hparams.h"
#include "model/weights.h"

namespace frink {

struct Model {
  std::unique_ptr<ModelFile> file;
  Hparams hp;
  Weights w;
};

// Opens a GGUF file or SafeTensors folder and loads it. Throws frink::Error on bad input:
// unknown architecture, missing or mis-shaped tensors, unsupported tensor types.
std::unique_ptr<Model> load_model(const std::string& path);

struct ArchDef {
  std::string_view name;  // general.architecture
  void (*read_hparams)(const Metadata& meta, Hparams& hp);
  void (*load_weights)(const Hparams& hp, WeightLoader& ld, Weights& w);
};

const ArchDef* find_arch(std::string_view name);
std::vector<std::string_view> supported_archs();

}  // namespace frink

// Options every model-running subcommand shares, spelled like llama.cpp's tools
// (-m, -t, -c, -b, sampling flags), registered in one place so they mean the same everywhere.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "engine/decoder.h"
#include "engine/sampler.h"
#include "model/model.h"

namespace frink::cli {

struct ModelOptions {
  std::string model;          // -m; empty: the model shipped with frink (models/)
  int threads = 0;            // -t; 0: all cores
  int64_t ctx = -1;           // -c; -1: 4096 or the model's, if smaller; 0: the model's
  int64_t batch = 512;        // -b
  std::string device = "auto";
  int64_t gpu_layers = -1;    // -ngl; -1: as many as device memory holds
  bool verbose = false;
};

void add_model_options(CLI::App& cmd, ModelOptions& o);
// --device NAME (cpu|cuda|auto) and -ngl N on a command; add_model_options includes them.
void add_device_option(CLI::App& cmd, std::string& name, int64_t& gpu_layers);
DeviceChoice device_choice(const std::string& name);
void add_sampling_options(CLI::App& cmd, SamplerParams& p);
// A check for integer options: every value at least lo ("-b must be at least 1, not 0"); CLI11's
// own number checks print the whole double range.
CLI::Validator at_least(int64_t lo);

// Applies --verbose, resolves the model path and --device, loads the model.
std::unique_ptr<Model> load_model_for(const ModelOptions& o);
// The decoder for m as o asks (its context planned for context_size).
DecoderOptions decoder_options(const ModelOptions& o, const Model& m);
// The context size a session should plan for: -c, or the model's training context.
int64_t context_size(const ModelOptions& o, const Model& m);

}  // namespace frink::cli

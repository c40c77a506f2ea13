// A whole (small) file as a string: configs, prompts, templates, texts to score. Model
// weights are mapped instead (core/mapped_file.h).
#pragma once

#include <string>

namespace frink {

// Throws frink::Error "cannot open 'PATH'" when the file cannot be read.
std::string read_file(const std::string& path);

}  // namespace frink

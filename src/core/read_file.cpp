#include "core/read_file.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace frink {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot open '{}'", path);
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail("cannot read '{}'", path);
  return ss.str();
}

}  // namespace frink

// One-line descriptions of a model's layer plan, for frink info and --verbose logs.
// Consecutive layers with the same plan are grouped ("layers 0-13: ...").
#pragma once

#include <string>
#include <vector>

#include "model/hparams.h"

namespace frink {

std::string describe_layer(const LayerPlan& p);
std::vector<std::string> describe_plan(const Hparams& hp);

}  // namespace frink

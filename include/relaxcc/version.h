#pragma once

#include <string>

#include "relaxcc/config.h"

namespace relaxcc {

// "0.1.0 (cuda=1 nccl=1 torch=0)": the version and the features this build has.
std::string build_description();

}  // namespace relaxcc

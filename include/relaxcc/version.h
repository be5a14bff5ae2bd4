#pragma once

#include <string>

#include "relaxcc/config.h"

namespace relaxcc {

// "0.1.0 (cuda_kernels=1)": the version and the features this build has.
std::string build_description();

}  // namespace relaxcc

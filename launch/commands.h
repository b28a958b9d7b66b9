// Subcommands implemented in launch/ (others live with their concern: data/, nsa/, ...).
#pragma once
#include <string>
#include <vector>

namespace nsatron {

inline constexpr const char* kVersion = "0.1.0";
#ifdef NSATRON_WITH_CUDA
inline constexpr bool kBuiltWithCuda = true;
#else
inline constexpr bool kBuiltWithCuda = false;
#endif

int config_main(const std::vector<std::string>& args);
int train_main(const std::vector<std::string>& args);
int sample_main(const std::vector<std::string>& args);
int sweep_main(const std::vector<std::string>& args);

}  // namespace nsatron

// `nsatron nsa-parity`: runs the NSA core on inputs from an HDF5 file (see docs/nsa.md).
#pragma once
#include <string>
#include <vector>

namespace nsatron::nsa {
// args: everything after `nsatron nsa-parity`. Returns the process exit code; throws
// nsatron::UserError for bad input (the CLI prints it and exits with code 2).
int parity_main(const std::vector<std::string>& args);
}  // namespace nsatron::nsa

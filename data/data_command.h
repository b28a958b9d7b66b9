// `nsatron data ...`: token shard preparation and inspection (see docs/data.md).
#pragma once
#include <string>
#include <vector>

namespace nsatron::data {
// args: everything after `nsatron data` (e.g. {"prepare", "--input", ...}). Returns the exit
// code; throws nsatron::UserError for bad input (the CLI prints it and exits with code 2).
int data_main(const std::vector<std::string>& args);
}  // namespace nsatron::data

// A small command-line parser shared by the subcommands: `--flag value`, `--flag=value`,
// repeatable flags, boolean switches and positionals. Unknown flags are errors.
#pragma once
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/util/error.h"

namespace nsatron {

class Args {
 public:
  // `value_flags` take a value; `switches` do not. Names include the dashes ("--set").
  Args(const std::string& command, const std::vector<std::string>& argv, std::set<std::string> value_flags,
       std::set<std::string> switches = {});
  bool has(const std::string& flag) const { return values_.count(flag) || set_switches_.count(flag); }
  std::optional<std::string> get(const std::string& flag) const;
  std::vector<std::string> all(const std::string& flag) const;  // every occurrence, in order
  long long get_int(const std::string& flag, long long fallback) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::string command_;
  std::map<std::string, std::vector<std::string>> values_;
  std::set<std::string> set_switches_;
  std::vector<std::string> positional_;
};

}  // namespace nsatron

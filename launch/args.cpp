#include "launch/args.h"

#include <cstdlib>

namespace nsatron {

Args::Args(const std::string& command, const std::vector<std::string>& argv, std::set<std::string> value_flags,
           std::set<std::string> switches)
    : command_(command) {
  for (std::size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.size() > 1 && a[0] == '-' && a != "-") {
      std::string name = a, value;
      bool inline_value = false;
      if (auto eq = a.find('='); eq != std::string::npos && a.rfind("--", 0) == 0) {
        name = a.substr(0, eq);
        value = a.substr(eq + 1);
        inline_value = true;
      }
      if (switches.count(name)) {
        if (inline_value) throw UserError(name + " takes no value");
        set_switches_.insert(name);
      } else if (value_flags.count(name)) {
        if (!inline_value) {
          if (i + 1 >= argv.size()) throw UserError(name + " needs a value (see `nsatron " + command + " --help`)");
          value = argv[++i];
        }
        values_[name].push_back(value);
      } else {
        throw UserError("unknown option '" + a + "' (see `nsatron " + command + " --help`)");
      }
    } else {
      positional_.push_back(a);
    }
  }
}

std::optional<std::string> Args::get(const std::string& flag) const {
  auto it = values_.find(flag);
  if (it == values_.end()) return std::nullopt;
  return it->second.back();
}

std::vector<std::string> Args::all(const std::string& flag) const {
  auto it = values_.find(flag);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

long long Args::get_int(const std::string& flag, long long fallback) const {
  auto v = get(flag);
  if (!v) return fallback;
  char* end = nullptr;
  long long x = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || *end) throw UserError(flag + " expects an integer, got '" + *v + "'");
  return x;
}

}  // namespace nsatron

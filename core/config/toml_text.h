// Small helpers for messages about a TOML document (toml++): where a node is, what type it
// has, its value as TOML text. Shared by the run config (config.cpp) and the sweep file
// (launch/sweep/sweep_file.cpp), so both name things the same way.
#pragma once
#include <toml++/toml.h>

#include <sstream>
#include <string>

namespace nsatron {

// "FILE:LINE:COL" of a node or key.
inline std::string toml_position(const std::string& source, const toml::source_region& r) {
  return source + ":" + std::to_string(r.begin.line) + ":" + std::to_string(r.begin.column);
}

// "an integer", "a string", "a table", ...
inline std::string toml_type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::string: return "a string";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date/time";
  }
}

// The value as TOML text (strings quoted): what a `--set section.key=` override takes.
inline std::string toml_value_text(const toml::node& n) {
  std::ostringstream os;
  n.visit([&](auto&& v) { os << v; });
  return os.str();
}

}  // namespace nsatron

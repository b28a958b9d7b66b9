// Human-readable numbers for logs and tool output: "38.1 GiB", "62.9k", "1m30s"; text for a
// JSON string.
#pragma once
#include <cmath>
#include <iomanip>
#include <sstream>
#include <string>

namespace nsatron {

inline std::string human_bytes(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) b /= 1024, ++i;
  std::ostringstream os;
  os << std::fixed << std::setprecision(i ? 1 : 0) << b << " " << unit[i];
  return os.str();
}

inline std::string human_count(double x) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1);
  if (x >= 1e21) os << x / 1e21 << "Z";
  else if (x >= 1e18) os << x / 1e18 << "E";
  else if (x >= 1e15) os << x / 1e15 << "P";
  else if (x >= 1e12) os << x / 1e12 << "T";
  else if (x >= 1e9) os << x / 1e9 << "G";
  else if (x >= 1e6) os << x / 1e6 << "M";
  else if (x >= 1e3) os << x / 1e3 << "k";
  else os << std::setprecision(0) << x;
  return os.str();
}

inline std::string human_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  long t = long(s + 0.5);
  std::ostringstream os;
  if (t >= 3600) os << t / 3600 << "h" << std::setw(2) << std::setfill('0') << (t % 3600) / 60 << "m";
  else if (t >= 60) os << t / 60 << "m" << std::setw(2) << std::setfill('0') << t % 60 << "s";
  else os << t << "s";
  return os.str();
}

// `text` as the inside of a JSON string literal: quotes and backslashes escaped, newlines as
// \n, other control characters dropped.
inline std::string json_escaped(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out;
}

}  // namespace nsatron

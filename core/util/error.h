// Errors: one exception type with a message meant for the user, and a check macro.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace nsatron {

// Thrown for bad input a user can fix (config, files, shapes). The CLI prints what() and
// exits with code 2.
struct UserError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Thrown when the machine, not the input, stops the work (a full disk): the CLI prints what()
// and exits with code 1, like any failure that is not bad input; what was committed before
// stays intact.
struct EnvironmentError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Args> std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace nsatron

// Internal invariant: violated means a bug in nsatron, not in the user's input.
#define NSA_CHECK(cond, ...)                                                                  \
  do {                                                                                        \
    if (!(cond))                                                                              \
      throw std::logic_error(::nsatron::detail::concat(__FILE__, ":", __LINE__, ": check '", \
                                                       #cond, "' failed: ", ##__VA_ARGS__)); \
  } while (0)

// `nsatron ckpt` as its own executable, with main.cpp's error handling, so that the tests
// can run the tools before (and independently of) their wiring into launch/main.cpp.
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "checkpoint/ckpt_command.h"
#include "core/util/error.h"

int main(int argc, char** argv) {
  try {
    return nsatron::checkpoint::ckpt_main(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const nsatron::UserError& e) {
    std::cerr << "nsatron ckpt: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "nsatron ckpt: internal error: " << e.what() << "\n";
    return 1;
  }
}

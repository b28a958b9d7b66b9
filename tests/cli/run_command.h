// Runs the nsatron executable (or any shell command) for end-to-end tests and captures its
// exit code, stdout and stderr.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

struct CommandResult {
  int code = -1;
  std::string out, err;
};

inline std::string read_file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline CommandResult run_command(const std::string& cmd) {
  char dir_template[] = "/tmp/nsatron_cmd_XXXXXX";
  std::string dir = mkdtemp(dir_template);
  int status = std::system((cmd + " >" + dir + "/out 2>" + dir + "/err").c_str());
  CommandResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file_text(dir + "/out");
  r.err = read_file_text(dir + "/err");
  std::system(("rm -rf " + dir).c_str());
  return r;
}

inline CommandResult run_nsatron(const std::string& args) {
  return run_command(std::string(NSATRON_BINARY) + " " + args);
}

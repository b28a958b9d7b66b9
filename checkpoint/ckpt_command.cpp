#include "checkpoint/ckpt_command.h"

#include "core/util/format.h"

#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/h5file.h"
#include "core/util/error.h"

namespace nsatron::checkpoint {

namespace {

const char* kUsage =
    "usage: nsatron ckpt <command> DIR [options]\n"
    "\n"
    "commands:\n"
    "  inspect   print a checkpoint's step, tokens, config and a table of its tensors\n"
    "  verify    check every checksum of a checkpoint; exit 0 if good, 1 naming what is damaged\n"
    "\n"
    "DIR: a run's checkpoint directory (checkpoint.dir; `latest` is followed) or one step\n"
    "directory (DIR/step_00001000). `nsatron ckpt <command> --help` describes each;\n"
    "docs/checkpoint.md has the format.\n";

const char* kInspectUsage =
    "usage: nsatron ckpt inspect DIR [options]\n"
    "\n"
    "Prints the checkpoint's step, consumed tokens, optimizer step, sampler position, RNG\n"
    "state, the resolved config it was written with, and a table of its tensors: name, shape,\n"
    "dtype and L2 norm (each tensor assembled from its shards; checksums are checked on the\n"
    "way, and a damaged tensor stops it with exit code 2: run `nsatron ckpt verify`).\n"
    "DIR: a run's checkpoint directory (follows `latest`) or a step directory.\n"
    "\n"
    "options:\n"
    "  --no-config           leave out the config text\n"
    "  --no-tensors          leave out the tensor table (reads no tensor data)\n"
    "  -h, --help            this text\n";

const char* kVerifyUsage =
    "usage: nsatron ckpt verify DIR [options]\n"
    "\n"
    "Checks a checkpoint as a load would: every rank file present and readable (a truncated\n"
    "file fails here), the root attributes and their checksum, every dataset of the manifest\n"
    "present, fp32, with the CRC-32 of its bytes equal to its crc32 attribute, every tensor\n"
    "covered by its shards, AdamW moments for every weight. Prints `ok: ...` and exits 0 when\n"
    "all is well; otherwise prints one line per problem (FILE: DATASET: what) and exits 1.\n"
    "DIR: a run's checkpoint directory (follows `latest`; a missing target is a problem) or a\n"
    "step directory.\n"
    "\n"
    "options:\n"
    "  --all                 with a run's directory: verify every committed step directory\n"
    "                        and the `latest` pointer\n"
    "  -h, --help            this text\n";

bool is_help(const std::string& a) { return a == "-h" || a == "--help"; }

// DIR plus switches; anything else is an error.
struct Parsed {
  std::string dir;
  std::vector<std::string> switches;
  bool has(const std::string& s) const { return std::find(switches.begin(), switches.end(), s) != switches.end(); }
};

Parsed parse(const std::string& cmd, const std::vector<std::string>& args, const std::vector<std::string>& allowed) {
  Parsed p;
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("-", 0) == 0) {
      if (std::find(allowed.begin(), allowed.end(), a) == allowed.end())
        throw UserError("ckpt " + cmd + ": unknown option '" + a + "' (see --help)");
      p.switches.push_back(a);
    } else if (p.dir.empty()) {
      p.dir = a;
    } else {
      throw UserError("ckpt " + cmd + ": one DIR expected, got '" + p.dir + "' and '" + a + "'");
    }
  }
  if (p.dir.empty()) throw UserError("ckpt " + cmd + ": DIR missing (see --help)");
  if (!fs::exists(p.dir)) throw UserError(p.dir + ": no such file or directory");
  return p;
}

std::string shown(const std::string& s) { return s.empty() ? "(none)" : s; }

int inspect(const std::vector<std::string>& args) {
  const Parsed a = parse("inspect", args, {"--no-config", "--no-tensors"});
  const fs::path step_dir = resolve_checkpoint(a.dir);
  const auto files = checkpoint_files(step_dir);
  CheckpointFile first(files.front());
  const TrainState& st = first.state();
  std::ostream& out = std::cout;
  out << "checkpoint   " << step_dir.string();
  if (fs::path(a.dir) != step_dir) out << " (latest of " << a.dir << ")";
  out << "\nformat       " << kFormatName << " version " << first.format_version() << ", " << files.size()
      << (files.size() == 1 ? " file" : " files") << ", written by layout " << first.layout().layout << "\n"
      << "step         " << st.step << "\n"
      << "tokens       " << st.consumed_tokens << "\n"
      << "optimizer    AdamW step " << st.optimizer_step << "\n"
      << "sampler      " << shown(st.sampler_position) << "\n"
      << "rng          " << shown(st.rng) << "\n";
  for (const auto& [k, v] : st.extra) out << "extra." << k << (k.size() < 6 ? std::string(6 - k.size(), ' ') : " ") << " " << v << "\n";
  if (!a.has("--no-config")) {
    out << "\n# config\n" << st.config_toml;
    if (!st.config_toml.empty() && st.config_toml.back() != '\n') out << "\n";
  }
  if (a.has("--no-tensors")) return 0;
  out << "\n# tensors\n";
  struct Row {
    std::string name, shape;
    double norm;
  };
  std::vector<Row> rows;
  std::size_t wname = 4, wshape = 5;
  std::int64_t params = 0, bytes = 0;
  for_each_tensor(step_dir, [&](const std::string& name, const FullTensor& t) {
    double ss = 0;
    for (float x : t.data) ss += double(x) * double(x);
    rows.push_back({name, shape_str(t.shape), std::sqrt(ss)});
    wname = std::max(wname, name.size());
    wshape = std::max(wshape, rows.back().shape.size());
    if (name.rfind("optim/", 0) != 0) params += std::int64_t(t.data.size());
    bytes += std::int64_t(t.data.size() * sizeof(float));
  });
  out << std::left << std::setw(int(wname)) << "name" << "  " << std::setw(int(wshape)) << "shape" << "  dtype  norm\n";
  for (const auto& r : rows) {
    char norm[64];
    std::snprintf(norm, sizeof norm, "%.6g", r.norm);
    out << std::setw(int(wname)) << r.name << "  " << std::setw(int(wshape)) << r.shape << "  fp32   " << norm << "\n";
  }
  out << std::right << "\n" << rows.size() << " tensors, " << params << " parameters, " << human_bytes(double(bytes))
      << "\n";
  return 0;
}

// Verifies one step directory (or a run's latest); prints ok or the problems.
bool verify_one(const fs::path& path, std::ostream& out) {
  const auto problems = verify_checkpoint(path);
  if (!problems.empty()) {
    for (const auto& p : problems) out << "error: " << p << "\n";
    out << "damaged: " << path.string() << ": " << problems.size() << (problems.size() == 1 ? " problem" : " problems")
        << "\n";
    return false;
  }
  const fs::path step_dir = resolve_checkpoint(path);
  const auto files = checkpoint_files(step_dir);
  std::size_t datasets = 0;
  std::int64_t bytes = 0, step = 0;
  for (const auto& f : files) {
    CheckpointFile cf(f);
    step = cf.state().step;
    datasets += cf.manifest().size();
    for (const auto& n : cf.manifest()) bytes += shape_numel(cf.info(n).shape) * std::int64_t(sizeof(float));
  }
  out << "ok: " << step_dir.string() << ": step " << step << ", " << files.size() << (files.size() == 1 ? " file, " : " files, ")
      << datasets << " datasets, " << human_bytes(double(bytes)) << " checked\n";
  return true;
}

int verify(const std::vector<std::string>& args) {
  const Parsed a = parse("verify", args, {"--all"});
  if (!a.has("--all")) return verify_one(a.dir, std::cout) ? 0 : 1;
  const auto all = list_checkpoints(a.dir);
  if (all.empty()) throw UserError(a.dir + ": no step directories (is it a run's checkpoint directory?)");
  bool good = true;
  if (!fs::exists(fs::path(a.dir) / "latest")) {
    std::cout << "error: " << (fs::path(a.dir) / "latest").string() << ": missing\n";
    good = false;
  } else {
    try {
      const fs::path target = resolve_checkpoint(a.dir);
      std::cout << "latest -> " << target.filename().string() << "\n";
    } catch (const UserError& e) {
      std::cout << "error: " << e.what() << "\n";
      good = false;
    }
  }
  for (const auto& p : all) good = verify_one(p, std::cout) && good;
  return good ? 0 : 1;
}

}  // namespace

int ckpt_main(const std::vector<std::string>& args) {
  // This process only reports: HDF5's own error printing stays off for its whole life. (After
  // reading a damaged file, HDF5 1.10 also prints "infinite loop closing library" at exit
  // when printing is on.)
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  if (args.empty()) {
    std::cerr << kUsage;
    return 2;
  }
  if (is_help(args[0])) {
    std::cout << kUsage;
    return 0;
  }
  const bool help = args.size() > 1 && std::any_of(args.begin() + 1, args.end(), is_help);
  if (args[0] == "inspect") {
    if (help) return std::cout << kInspectUsage, 0;
    return inspect(args);
  }
  if (args[0] == "verify") {
    if (help) return std::cout << kVerifyUsage, 0;
    return verify(args);
  }
  std::cerr << "nsatron ckpt: unknown command '" << args[0] << "'\n\n" << kUsage;
  return 2;
}

}  // namespace nsatron::checkpoint

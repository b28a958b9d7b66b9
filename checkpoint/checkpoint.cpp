#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <memory>
#include <sstream>

#include "checkpoint/h5file.h"
#include "core/util/error.h"

namespace nsatron::checkpoint {

namespace {

constexpr const char* kLatest = "latest";
constexpr const char* kLatestTmp = "latest.tmp";
constexpr const char* kMomentM = "optim/m/";
constexpr const char* kMomentV = "optim/v/";

std::string errno_text() { return std::strerror(errno); }

// "step_<digits>" exactly: a committed checkpoint. Anything else (step_X.tmp-PID) is not.
std::optional<std::int64_t> parse_step_name(const std::string& name) {
  if (name.size() <= 5 || name.rfind("step_", 0) != 0 || name.size() > 5 + 18) return std::nullopt;
  std::int64_t v = 0;
  for (std::size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

std::optional<std::int64_t> parse_rank_name(const std::string& name) {
  if (name.size() <= 8 || name.rfind("rank_", 0) != 0 || name.substr(name.size() - 3) != ".h5") return std::nullopt;
  std::int64_t v = 0;
  for (std::size_t i = 5; i + 3 < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || i > 5 + 17) return std::nullopt;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

bool is_staging_name(const std::string& name) {
  return name.rfind("step_", 0) == 0 && name.find(".tmp-") != std::string::npos;
}

void fsync_path(const fs::path& p, bool directory) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0));
  if (fd < 0) throw UserError(p.string() + ": cannot open for fsync: " + errno_text());
  if (::fsync(fd) != 0) {
    const std::string e = errno_text();
    ::close(fd);
    throw UserError(p.string() + ": fsync failed: " + e);
  }
  ::close(fd);
}

void rename_or_throw(const fs::path& from, const fs::path& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0)
    throw UserError("cannot rename " + from.string() + " to " + to.string() + ": " + errno_text());
}

// The trimmed content of dir/latest, when it is a valid step directory name.
struct LatestPointer {
  bool exists = false;
  std::string name;   // valid step_<digits> name, or empty
  std::string error;  // why the content is not usable
};

LatestPointer read_latest(const fs::path& dir) {
  LatestPointer lp;
  const fs::path p = dir / kLatest;
  std::error_code ec;
  if (!fs::exists(p, ec)) return lp;
  lp.exists = true;
  std::FILE* f = std::fopen(p.c_str(), "rb");
  if (!f) {
    lp.error = p.string() + ": cannot read: " + errno_text();
    return lp;
  }
  char buf[256];
  const std::size_t n = std::fread(buf, 1, sizeof buf, f);
  std::fclose(f);
  std::string s(buf, n);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  if (!parse_step_name(s)) {
    lp.error = p.string() + ": does not name a step directory (content '" + s.substr(0, 64) + "')";
    return lp;
  }
  lp.name = s;
  return lp;
}

void write_latest(const fs::path& dir, const std::string& name) {
  const fs::path tmp = dir / kLatestTmp;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw UserError(tmp.string() + ": cannot write: " + errno_text());
  const std::string text = name + "\n";
  const bool ok = ::write(fd, text.data(), text.size()) == ssize_t(text.size()) && ::fsync(fd) == 0;
  const std::string e = errno_text();
  ::close(fd);
  if (!ok) throw UserError(tmp.string() + ": cannot write: " + e);
  rename_or_throw(tmp, dir / kLatest);
  fsync_path(dir, true);
}

// Best effort: a committed save is not undone by a failing clean-up.
void cleanup(const fs::path& dir, int keep) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (is_staging_name(name) && e.is_directory(ec)) fs::remove_all(e.path(), ec);
  }
  if (keep > 0) {
    const LatestPointer lp = read_latest(dir);
    std::vector<fs::path> others;
    for (const auto& p : list_checkpoints(dir))
      if (p.filename().string() != lp.name) others.push_back(p);
    // `others` ascends by step; the latest target counts as one of the `keep`.
    const std::size_t retain = std::size_t(keep - 1);
    const std::size_t drop = others.size() > retain ? others.size() - retain : 0;
    for (std::size_t i = 0; i < drop; ++i) {
      // Renamed first, so it disappears at once; a kill mid-delete leaves a *.tmp-* directory.
      const fs::path doomed = dir / (others[i].filename().string() + ".tmp-" + std::to_string(::getpid()) + "-old");
      if (std::rename(others[i].c_str(), doomed.c_str()) == 0) fs::remove_all(doomed, ec);
    }
  }
  try {
    fsync_path(dir, true);
  } catch (const UserError&) {
  }
}

// ---- reading a whole checkpoint -------------------------------------------------------------

struct ShardRef {
  const CheckpointFile* file;
  DatasetInfo info;
};

// The open files of one step directory, checked for consistency, and every dataset's shards.
struct OpenCheckpoint {
  fs::path dir;
  std::vector<CheckpointFile> files;
  std::map<std::string, std::vector<ShardRef>> shards;  // by dataset name
  const TrainState& state() const { return files.front().state(); }
};

// Opens every file of a step directory; throws UserError at the first problem.
OpenCheckpoint open_checkpoint(const fs::path& step_dir) {
  OpenCheckpoint oc;
  oc.dir = step_dir;
  const auto paths = checkpoint_files(step_dir);
  for (const auto& p : paths) oc.files.emplace_back(p);
  const CheckpointFile& first = oc.files.front();
  if (first.layout().num_files != std::int64_t(paths.size()))
    throw UserError((step_dir / rank_file_name(std::int64_t(paths.size()))).string() + ": missing (" +
                    paths.front().string() + " says num_files = " + std::to_string(first.layout().num_files) + ")");
  for (std::size_t r = 0; r < oc.files.size(); ++r) {
    const CheckpointFile& f = oc.files[r];
    if (f.layout().rank != std::int64_t(r))
      throw UserError(f.path().string() + ": attribute rank is " + std::to_string(f.layout().rank) + ", expected " +
                      std::to_string(r));
    if (f.layout().num_files != first.layout().num_files || !(f.state() == first.state()))
      throw UserError(f.path().string() + ": its step, state or num_files differ from " + first.path().string());
    for (const auto& name : f.manifest()) oc.shards[name].push_back({&f, f.info(name)});
  }
  return oc;
}

// Writes the full tensor `name` (of shape `global`) into dst from its shards.
void assemble(const std::string& name, const std::vector<ShardRef>& shards, const Shape& global, float* dst) {
  NSA_CHECK(!shards.empty());
  const std::int64_t numel = shape_numel(global);
  for (const auto& s : shards)
    if (s.info.global_shape != global)
      throw UserError(s.file->path().string() + ": " + name + ": global_shape " + shape_str(s.info.global_shape) +
                      " but another shard says " + shape_str(global));
  // A shard holding the whole tensor: read it in place.
  for (const auto& s : shards)
    if (s.info.shape == global) {
      s.file->read(s.info, dst);
      return;
    }
  const std::size_t nd = global.size();
  std::vector<std::int64_t> gstride(nd, 1);
  for (std::size_t d = nd - 1; d-- > 0;) gstride[d] = gstride[d + 1] * global[d + 1];
  std::vector<std::uint8_t> covered(std::size_t(numel), 0);
  std::vector<float> buf;
  for (const auto& s : shards) {
    const Shape& sh = s.info.shape;
    buf.resize(std::size_t(shape_numel(sh)));
    s.file->read(s.info, buf.data());
    if (buf.empty()) continue;
    const std::int64_t row = sh[nd - 1];
    const std::int64_t rows = shape_numel(sh) / row;
    std::vector<std::int64_t> idx(nd, 0);  // index of the row within the shard (last dim unused)
    for (std::int64_t r = 0; r < rows; ++r) {
      std::int64_t at = s.info.offset[nd - 1];
      for (std::size_t d = 0; d + 1 < nd; ++d) at += (s.info.offset[d] + idx[d]) * gstride[d];
      const float* src = buf.data() + r * row;
      for (std::int64_t j = 0; j < row; ++j) {
        const std::size_t g = std::size_t(at + j);
        if (covered[g] && std::memcmp(&dst[g], &src[j], sizeof(float)) != 0)
          throw UserError(s.file->path().string() + ": " + name + ": overlapping shards hold different values");
        dst[g] = src[j];
        covered[g] = 1;
      }
      for (std::size_t d = nd - 1; d-- > 0;) {  // next row: odometer over the leading dims
        if (++idx[d] < sh[d]) break;
        idx[d] = 0;
      }
    }
  }
  const auto missing = std::count(covered.begin(), covered.end(), std::uint8_t(0));
  if (missing > 0)
    throw UserError(shards.front().file->path().parent_path().string() + ": " + name + ": the shards leave " + std::to_string(missing) + " of " +
                    std::to_string(numel) + " elements uncovered (a file is missing?)");
}

}  // namespace

// ---- names and directories ------------------------------------------------------------------

std::string rank_file_name(std::int64_t rank) {
  char b[64];
  std::snprintf(b, sizeof b, "rank_%05lld.h5", (long long)rank);
  return b;
}

std::string step_dir_name(std::int64_t step) {
  char b[64];
  std::snprintf(b, sizeof b, "step_%08lld", (long long)step);
  return b;
}

std::vector<fs::path> list_checkpoints(const fs::path& dir) {
  std::vector<std::pair<std::int64_t, fs::path>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const auto step = parse_step_name(e.path().filename().string());
    if (step && e.is_directory(ec)) found.emplace_back(*step, e.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

std::vector<fs::path> checkpoint_files(const fs::path& step_dir) {
  std::map<std::int64_t, fs::path> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(step_dir, ec)) {
    const auto rank = parse_rank_name(e.path().filename().string());
    if (rank) found[*rank] = e.path();
  }
  if (ec) throw UserError(step_dir.string() + ": cannot list: " + ec.message());
  if (found.empty()) throw UserError(step_dir.string() + ": no checkpoint files (rank_*.h5)");
  std::vector<fs::path> out;
  for (const auto& [rank, p] : found) {
    if (rank != std::int64_t(out.size()))
      throw UserError((step_dir / rank_file_name(std::int64_t(out.size()))).string() + ": missing");
    out.push_back(p);
  }
  return out;
}

fs::path resolve_checkpoint(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) throw UserError(path.string() + ": no such checkpoint directory");
  for (const auto& e : fs::directory_iterator(path, ec))
    if (parse_rank_name(e.path().filename().string())) return path;
  const LatestPointer lp = read_latest(path);
  if (lp.exists) {
    if (!lp.error.empty()) throw UserError(lp.error);
    const fs::path target = path / lp.name;
    if (!fs::is_directory(target, ec))
      throw UserError((path / kLatest).string() + " names " + lp.name + ", which does not exist");
    return target;
  }
  const auto all = list_checkpoints(path);
  if (!all.empty())
    throw UserError(path.string() + ": no 'latest' pointer; name a step directory, e.g. " + all.back().string());
  throw UserError(path.string() + ": not a checkpoint (no rank_*.h5 files, no 'latest' pointer)");
}

// ---- saving -------------------------------------------------------------------------------

fs::path stage_checkpoint(const fs::path& dir, std::int64_t step) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw UserError(dir.string() + ": cannot create the checkpoint directory: " + ec.message());
  const fs::path staging = dir / (step_dir_name(step) + ".tmp-" + std::to_string(::getpid()));
  fs::remove_all(staging, ec);  // a failed earlier attempt of this process
  if (!fs::create_directory(staging, ec) || ec)
    throw UserError(staging.string() + ": cannot create: " + (ec ? ec.message() : std::string("exists")));
  return staging;
}

fs::path commit_checkpoint(const fs::path& dir, const fs::path& staging, std::int64_t step, int keep) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(staging, ec))
    if (e.is_regular_file()) fsync_path(e.path(), false);
  if (ec) throw UserError(staging.string() + ": cannot list: " + ec.message());
  fsync_path(staging, true);
  const std::string name = step_dir_name(step);
  const fs::path final_dir = dir / name;
  if (fs::exists(final_dir, ec)) {
    // A checkpoint of this step exists (a run resumed from an earlier one): swap the two
    // directories in one step, so that final_dir is complete at every moment, then delete
    // the old one under the staging name.
    if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0)
      throw UserError(final_dir.string() + " exists and cannot be replaced atomically here (" + errno_text() +
                      "); move it away and save again");
    fsync_path(dir, true);
    fs::remove_all(staging, ec);
  } else {
    rename_or_throw(staging, final_dir);
    fsync_path(dir, true);
  }
  write_latest(dir, name);
  cleanup(dir, keep);
  return final_dir;
}

std::vector<ShardSpec> param_shards(const ParamStore& params, const float* weights, const float* m, const float* v,
                                    std::int64_t m_begin, std::int64_t begin, std::int64_t end) {
  if (begin < 0 || end > params.total() || begin > end)
    throw std::invalid_argument("param_shards: range [" + std::to_string(begin) + ", " + std::to_string(end) +
                                ") outside the " + std::to_string(params.total()) + " elements of the parameters");
  if (!weights && params.total() > 0) throw std::invalid_argument("param_shards: no weights");
  if ((m == nullptr) != (v == nullptr)) throw std::invalid_argument("param_shards: give both moments or neither");
  if (m && m_begin > begin)
    throw std::invalid_argument("param_shards: the moments start at " + std::to_string(m_begin) +
                                ", after the range's begin " + std::to_string(begin));
  std::vector<const ParamInfo*> mine;
  for (const auto& p : params.infos()) {
    if (p.name.rfind("optim/", 0) == 0) throw std::invalid_argument("parameter name '" + p.name + "' is reserved");
    if (p.replica || p.offset < begin || p.offset >= end) continue;
    if (p.offset + p.numel > end)
      throw std::invalid_argument("param_shards: " + p.name + " (elements [" + std::to_string(p.offset) + ", " +
                                  std::to_string(p.offset + p.numel) + ")) straddles the end of the range " +
                                  std::to_string(end));
    mine.push_back(&p);
  }
  std::vector<ShardSpec> shards;
  shards.reserve(mine.size() * (m ? 3 : 1));
  auto add = [&](const std::string& prefix, const float* base, std::int64_t base_offset) {
    for (const ParamInfo* p : mine)
      shards.push_back({prefix + p->name, p->global_shape, p->global_offset, p->shape, base + (p->offset - base_offset)});
  };
  add("", weights, 0);
  if (m) {
    add(kMomentM, m, m_begin);
    add(kMomentV, v, m_begin);
  }
  return shards;
}

fs::path save_checkpoint(const fs::path& dir, const ParamStore& params, const Tensor& m, const Tensor& v,
                         const TrainState& state, int keep) {
  const Tensor& w = params.flat_weights();
  if (w.dtype() != DType::F32 || m.dtype() != DType::F32 || v.dtype() != DType::F32)
    throw std::invalid_argument("save_checkpoint: weights and moments must be fp32");
  if (w.numel() != params.total() || m.numel() != params.total() || v.numel() != params.total())
    throw std::invalid_argument("save_checkpoint: m and v must be flat buffers of " + std::to_string(params.total()) +
                                " elements like the weights");
  auto host = [](const Tensor& t) { return t.is_cpu() ? t : t.to(Device::CPU); };
  const Tensor hw = host(w), hm = host(m), hv = host(v);
  const float* pw = static_cast<const float*>(hw.raw());
  const float* pm = static_cast<const float*>(hm.raw());
  const float* pv = static_cast<const float*>(hv.raw());
  const std::vector<ShardSpec> shards = param_shards(params, pw, pm, pv, 0, 0, params.total());
  const fs::path staging = stage_checkpoint(dir, state.step);
  try {
    write_checkpoint_file(staging / rank_file_name(0), shards, state, FileLayout{});
  } catch (...) {
    std::error_code ec;
    fs::remove_all(staging, ec);
    throw;
  }
  return commit_checkpoint(dir, staging, state.step, keep);
}

// ---- loading ------------------------------------------------------------------------------

TrainState read_train_state(const fs::path& path) {
  const auto files = checkpoint_files(resolve_checkpoint(path));
  return CheckpointFile(files.front()).state();
}

FullTensor read_full_tensor(const std::vector<fs::path>& files, const std::string& name) {
  if (files.empty()) throw UserError("read_full_tensor: no files given");
  std::vector<CheckpointFile> open;
  for (const auto& p : files) open.emplace_back(p);
  std::vector<ShardRef> shards;
  for (const auto& f : open)
    if (f.lists(name)) shards.push_back({&f, f.info(name)});
  if (shards.empty()) throw UserError(files.front().parent_path().string() + ": " + name + ": no such tensor");
  FullTensor t;
  t.shape = shards.front().info.global_shape;
  t.data.resize(std::size_t(shape_numel(t.shape)));
  assemble(name, shards, t.shape, t.data.data());
  return t;
}

namespace {

// Loads the weights and, when m and v are given, the moments.
TrainState load_into(const fs::path& path, ParamStore& params, Tensor* m, Tensor* v, const LoadScope& scope) {
  const fs::path step_dir = resolve_checkpoint(path);
  OpenCheckpoint oc = open_checkpoint(step_dir);
  Tensor& w = params.flat_weights();
  const bool moments = m && v;
  if (w.dtype() != DType::F32 || (moments && (m->dtype() != DType::F32 || v->dtype() != DType::F32)))
    throw std::invalid_argument("load_checkpoint: weights and moments must be fp32");
  if (w.numel() != params.total() || (moments && (m->numel() != params.total() || v->numel() != params.total())))
    throw std::invalid_argument("load_checkpoint: m and v must be flat buffers like the weights");

  // Names and shapes first, all of them, before any data is read.
  std::vector<std::string> problems;
  std::map<std::string, bool> expected;
  for (const auto& p : params.infos())
    for (const std::string& prefix : {std::string(), std::string(kMomentM), std::string(kMomentV)}) {
      const std::string name = prefix + p.name;
      expected[name] = true;
      auto it = oc.shards.find(name);
      if (it == oc.shards.end()) {
        if (prefix.empty()) problems.push_back(name + ": in the config's model but not in the checkpoint");
        else if (moments) problems.push_back(name + ": missing from the checkpoint (the moment of " + p.name + ")");
        continue;
      }
      const Shape& g = it->second.front().info.global_shape;
      if (g != p.global_shape)
        problems.push_back(name + ": checkpoint shape " + shape_str(g) + " but the config gives " +
                           shape_str(p.global_shape));
    }
  // Tensors the store lacks: an error for a whole model; for a part, unless the whole model
  // has them (moments: their weight's name).
  std::set<std::string> model(scope.model_names.begin(), scope.model_names.end());
  for (const auto& [name, refs] : oc.shards) {
    if (expected.count(name)) continue;
    std::string weight = name;
    for (const char* prefix : {kMomentM, kMomentV})
      if (name.rfind(prefix, 0) == 0) weight = name.substr(std::string(prefix).size());
    if (!scope.partial || (!model.empty() && !model.count(weight)))
      problems.push_back(name + ": in the checkpoint but not in the config's model");
  }
  if (!problems.empty()) {
    std::string msg = step_dir.string() + " does not match the model:";
    for (const auto& p : problems) msg += "\n  " + p;
    throw UserError(msg);
  }

  auto host = [](Tensor& t) { return t.is_cpu() ? t : Tensor::empty(t.shape(), t.dtype(), Device::CPU); };
  Tensor hw = host(w);
  Tensor hm = moments ? host(*m) : Tensor(), hv = moments ? host(*v) : Tensor();
  std::vector<float> full;  // a block's whole tensor
  for (const auto& p : params.infos()) {
    // A whole parameter is assembled in place; a block via the whole tensor.
    auto load = [&](const std::string& name, Tensor& flat) {
      float* dst = static_cast<float*>(flat.raw()) + p.offset;
      // (is_whole(p), spelled out: nsatron_checkpoint does not link the model library.)
      if (p.global_shape == p.shape) return assemble(name, oc.shards[name], p.global_shape, dst);
      full.resize(std::size_t(shape_numel(p.global_shape)));
      assemble(name, oc.shards[name], p.global_shape, full.data());
      extract_box(full.data(), p.global_shape, p.global_offset, p.shape, dst);
    };
    load(p.name, hw);
    if (!moments) continue;
    load(kMomentM + p.name, hm);
    load(kMomentV + p.name, hv);
  }
  if (!w.is_cpu()) w.copy_from(hw);
  if (moments && !m->is_cpu()) m->copy_from(hm);
  if (moments && !v->is_cpu()) v->copy_from(hv);
  return oc.state();
}

}  // namespace

TrainState load_checkpoint(const fs::path& path, ParamStore& params, Tensor& m, Tensor& v, const LoadScope& scope) {
  return load_into(path, params, &m, &v, scope);
}

TrainState load_weights(const fs::path& path, ParamStore& params, const LoadScope& scope) {
  return load_into(path, params, nullptr, nullptr, scope);
}

void for_each_tensor(const fs::path& path,
                     const std::function<void(const std::string& name, const FullTensor&)>& fn) {
  OpenCheckpoint oc = open_checkpoint(resolve_checkpoint(path));
  std::vector<std::string> order;
  std::map<std::string, bool> seen;
  for (const auto& f : oc.files)
    for (const auto& name : f.manifest())
      if (!seen[name]) {
        seen[name] = true;
        order.push_back(name);
      }
  FullTensor t;
  for (const auto& name : order) {
    const auto& shards = oc.shards[name];
    t.shape = shards.front().info.global_shape;
    t.data.assign(std::size_t(shape_numel(t.shape)), 0.0f);
    assemble(name, shards, t.shape, t.data.data());
    fn(name, t);
  }
}

// ---- verifying ----------------------------------------------------------------------------

std::vector<std::string> verify_checkpoint(const fs::path& path) {
  std::vector<std::string> problems;
  fs::path step_dir;
  std::vector<fs::path> paths;
  try {
    step_dir = resolve_checkpoint(path);
    paths = checkpoint_files(step_dir);
  } catch (const UserError& e) {
    problems.push_back(e.what());
    if (paths.empty()) {
      // checkpoint_files stops at the first gap; report the files it would have opened, too.
      if (step_dir.empty()) return problems;
      std::error_code ec;
      for (const auto& e2 : fs::directory_iterator(step_dir, ec))
        if (parse_rank_name(e2.path().filename().string())) paths.push_back(e2.path());
      std::sort(paths.begin(), paths.end());
    }
  }
  std::vector<std::unique_ptr<CheckpointFile>> files;
  for (const auto& p : paths) {
    try {
      files.push_back(std::make_unique<CheckpointFile>(p));
    } catch (const UserError& e) {
      problems.push_back(e.what());
    }
  }
  if (files.empty()) return problems;

  const CheckpointFile& first = *files.front();
  for (std::int64_t r = 0; r < first.layout().num_files; ++r)
    if (!fs::exists(step_dir / rank_file_name(r)))
      problems.push_back((step_dir / rank_file_name(r)).string() + ": missing (num_files = " +
                         std::to_string(first.layout().num_files) + ")");
  struct Shard {
    const CheckpointFile* file;
    DatasetInfo info;
  };
  std::map<std::string, std::vector<Shard>> shards;
  for (const auto& fp : files) {
    const CheckpointFile& f = *fp;
    const std::string where = f.path().string();
    if (auto r = parse_rank_name(f.path().filename().string()); r && *r != f.layout().rank)
      problems.push_back(where + ": attribute rank is " + std::to_string(f.layout().rank));
    if (&f != &first && (f.layout().num_files != first.layout().num_files || !(f.state() == first.state())))
      problems.push_back(where + ": its step, state or num_files differ from " + first.path().string());
    try {
      for (const auto& name : f.datasets_in_file())
        if (!f.lists(name)) problems.push_back(where + ": " + name + ": dataset not in the manifest (attribute datasets)");
    } catch (const UserError& e) {
      problems.push_back(e.what());
    }
    std::vector<float> buf;
    for (const auto& name : f.manifest()) {
      try {
        DatasetInfo di = f.info(name);
        buf.resize(std::size_t(shape_numel(di.shape)));
        f.read(di, buf.data());
        shards[name].push_back({&f, std::move(di)});
      } catch (const UserError& e) {
        problems.push_back(e.what());
      }
    }
  }
  // Every tensor whole, and moments for every weight. (Tensors with a damaged shard were
  // reported above; coverage is checked over the shards that read.)
  for (const auto& [name, list] : shards) {
    const Shape& g = list.front().info.global_shape;
    bool same = true;
    for (const auto& s : list) same = same && s.info.global_shape == g;
    if (!same) {
      problems.push_back(step_dir.string() + ": " + name + ": shards disagree on global_shape");
      continue;
    }
    const std::int64_t numel = shape_numel(g);
    std::vector<std::uint8_t> covered(std::size_t(numel), 0);
    const std::size_t nd = g.size();
    std::vector<std::int64_t> gstride(nd, 1);
    for (std::size_t d = nd - 1; d-- > 0;) gstride[d] = gstride[d + 1] * g[d + 1];
    for (const auto& s : list) {
      const Shape& sh = s.info.shape;
      if (shape_numel(sh) == 0) continue;
      const std::int64_t rows = shape_numel(sh) / sh[nd - 1];
      std::vector<std::int64_t> idx(nd, 0);
      for (std::int64_t r = 0; r < rows; ++r) {
        std::int64_t at = s.info.offset[nd - 1];
        for (std::size_t d = 0; d + 1 < nd; ++d) at += (s.info.offset[d] + idx[d]) * gstride[d];
        std::fill_n(covered.begin() + at, sh[nd - 1], std::uint8_t(1));
        for (std::size_t d = nd - 1; d-- > 0;) {
          if (++idx[d] < sh[d]) break;
          idx[d] = 0;
        }
      }
    }
    const auto missing = std::count(covered.begin(), covered.end(), std::uint8_t(0));
    if (missing > 0)
      problems.push_back(step_dir.string() + ": " + name + ": " + std::to_string(missing) + " of " +
                         std::to_string(numel) + " elements are in no shard");
    const bool moment = name.rfind("optim/", 0) == 0;
    if (!moment) {
      for (const char* prefix : {kMomentM, kMomentV}) {
        auto it = shards.find(prefix + name);
        if (it == shards.end()) {
          // Reported already when the manifest lists it; otherwise it was never written.
          bool listed = false;
          for (const auto& fp : files) listed = listed || fp->lists(prefix + name);
          if (!listed) problems.push_back(step_dir.string() + ": " + prefix + name + ": missing (the moment of " + name + ")");
        } else if (it->second.front().info.global_shape != g) {
          problems.push_back(step_dir.string() + ": " + prefix + name + ": shape " +
                             shape_str(it->second.front().info.global_shape) + " differs from " + name + " " +
                             shape_str(g));
        }
      }
    }
  }
  return problems;
}

// ---- resuming -----------------------------------------------------------------------------

ResumeChoice find_resume(const fs::path& dir) {
  ResumeChoice rc;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return rc;
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "; " : "") + v[i];
    return s;
  };
  const LatestPointer lp = read_latest(dir);
  std::string bad;  // the latest target, when damaged: not tried again
  if (lp.exists) {
    if (!lp.error.empty()) {
      rc.warnings.push_back(lp.error);
    } else if (!fs::is_directory(dir / lp.name, ec)) {
      rc.warnings.push_back((dir / kLatest).string() + " names " + lp.name + ", which does not exist");
    } else {
      const auto problems = verify_checkpoint(dir / lp.name);
      if (problems.empty()) {
        rc.checkpoint = dir / lp.name;
        return rc;
      }
      rc.warnings.push_back((dir / kLatest).string() + " names " + lp.name + ", which is damaged: " + join(problems));
      bad = lp.name;
    }
  }
  auto all = list_checkpoints(dir);
  if (!lp.exists && !all.empty()) rc.warnings.push_back((dir / kLatest).string() + ": missing");
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->filename().string() == bad) continue;
    const auto problems = verify_checkpoint(*it);
    if (problems.empty()) {
      rc.checkpoint = *it;
      rc.warnings.push_back("resuming from " + it->string() + ", the newest checkpoint that verifies");
      return rc;
    }
    rc.warnings.push_back(it->string() + " is damaged: " + join(problems));
  }
  if (lp.exists || !all.empty()) {
    std::string msg = dir.string() + ": no usable checkpoint (nothing was deleted):";
    for (const auto& w : rc.warnings) msg += "\n  " + w;
    throw UserError(msg);
  }
  return rc;
}

}  // namespace nsatron::checkpoint

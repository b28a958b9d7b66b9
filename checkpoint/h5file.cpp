#include "checkpoint/h5file.h"

#include <hdf5.h>

#include <algorithm>
#include <cctype>
#include <bit>
#include <cstring>
#include <functional>
#include <iomanip>
#include <memory>
#include <sstream>
#include <type_traits>

#include "checkpoint/crc32.h"
#include "core/util/error.h"

namespace nsatron::checkpoint {

static_assert(std::is_same_v<hid_t, std::int64_t>, "CheckpointFile stores a hid_t as int64");
static_assert(std::endian::native == std::endian::little,
              "checksums are defined over little-endian bytes; add a byte swap for big-endian hosts");

namespace {

// ---- HDF5 plumbing ----------------------------------------------------------------------

// Owns one HDF5 identifier.
class Hid {
 public:
  using Closer = herr_t (*)(hid_t);
  Hid() = default;
  Hid(hid_t id, Closer close) : id_(id), close_(close) {}
  Hid(Hid&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  ~Hid() {
    if (id_ >= 0 && close_) close_(id_);
  }
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_ = -1;
  Closer close_ = nullptr;
};

// Silences HDF5's printing of its error stack while alive: we report errors ourselves.
class Quiet {
 public:
  Quiet() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~Quiet() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  Quiet(const Quiet&) = delete;
  Quiet& operator=(const Quiet&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

herr_t collect_error(unsigned, const H5E_error2_t* err, void* out) {
  if (err->desc && *err->desc) static_cast<std::vector<std::string>*>(out)->push_back(err->desc);
  return 0;
}

// The innermost (most specific) message of HDF5's error stack, which is then cleared.
std::string hdf5_error() {
  std::vector<std::string> msgs;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &msgs);
  H5Eclear2(H5E_DEFAULT);
  if (msgs.empty()) return "HDF5 error";
  std::string m = msgs.back();
  if (msgs.size() > 1 && msgs.front() != m) m = msgs.front() + ": " + m;
  return m;
}

// A problem with one object of a file; callers add the file (and dataset) names.
struct Problem {
  std::string what;
};

// ---- attributes -----------------------------------------------------------------------------

// False when absent; throws when HDF5 cannot tell (a damaged object header, for one).
bool has_attr(hid_t obj, const char* name) {
  const htri_t e = H5Aexists(obj, name);
  if (e < 0) throw Problem{std::string("cannot read attribute ") + name + " (" + hdf5_error() + ")"};
  return e > 0;
}

void write_attr_raw(hid_t obj, const char* name, hid_t file_type, hid_t mem_type, hid_t space, const void* buf) {
  Hid a(H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!a.ok() || H5Awrite(a.get(), mem_type, buf) < 0) throw Problem{std::string("cannot write attribute ") + name + " (" + hdf5_error() + ")"};
}

void write_attr_i64(hid_t obj, const char* name, std::int64_t v) {
  Hid s(H5Screate(H5S_SCALAR), H5Sclose);
  write_attr_raw(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, s.get(), &v);
}

void write_attr_u32(hid_t obj, const char* name, std::uint32_t v) {
  Hid s(H5Screate(H5S_SCALAR), H5Sclose);
  write_attr_raw(obj, name, H5T_STD_U32LE, H5T_NATIVE_UINT32, s.get(), &v);
}

void write_attr_i64s(hid_t obj, const char* name, const Shape& v) {
  const hsize_t n = v.size();
  Hid s(H5Screate_simple(1, &n, nullptr), H5Sclose);
  write_attr_raw(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, s.get(), v.data());
}

// A fixed-length UTF-8 string (null-padded; at least one byte, so "" is one NUL). Not
// variable-length: those live in HDF5's global heap, which has no checksum, and HDF5 1.10 can
// loop forever reading a damaged one. Fixed-length values live in the attribute message of
// the (checksummed) object header. h5py reads them as bytes.
void write_attr_str(hid_t obj, const char* name, const std::string& v) {
  Hid t(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(t.get(), std::max<std::size_t>(v.size(), 1));
  H5Tset_strpad(t.get(), H5T_STR_NULLPAD);
  H5Tset_cset(t.get(), H5T_CSET_UTF8);
  Hid s(H5Screate(H5S_SCALAR), H5Sclose);
  std::string buf = v;
  buf.resize(std::max<std::size_t>(v.size(), 1), '\0');
  write_attr_raw(obj, name, t.get(), t.get(), s.get(), buf.data());
}

Hid open_attr(hid_t obj, const char* name) {
  if (!has_attr(obj, name)) throw Problem{std::string("attribute ") + name + " is missing"};
  Hid a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (!a.ok()) throw Problem{std::string("cannot open attribute ") + name + " (" + hdf5_error() + ")"};
  return a;
}

// Integer attribute values (a scalar gives one).
std::vector<std::int64_t> read_attr_ints(hid_t obj, const char* name) {
  Hid a = open_attr(obj, name);
  Hid t(H5Aget_type(a.get()), H5Tclose);
  if (H5Tget_class(t.get()) != H5T_INTEGER) throw Problem{std::string("attribute ") + name + " is not an integer"};
  Hid s(H5Aget_space(a.get()), H5Sclose);
  const hssize_t n = H5Sget_simple_extent_npoints(s.get());
  if (n < 0) throw Problem{std::string("attribute ") + name + ": bad dataspace"};
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  if (n > 0 && H5Aread(a.get(), H5T_NATIVE_INT64, v.data()) < 0)
    throw Problem{std::string("cannot read attribute ") + name + " (" + hdf5_error() + ")"};
  return v;
}

std::int64_t read_attr_i64(hid_t obj, const char* name) {
  auto v = read_attr_ints(obj, name);
  if (v.size() != 1) throw Problem{std::string("attribute ") + name + " is not a single integer"};
  return v[0];
}

std::uint32_t read_attr_u32(hid_t obj, const char* name) {
  Hid a = open_attr(obj, name);
  Hid t(H5Aget_type(a.get()), H5Tclose);
  Hid s(H5Aget_space(a.get()), H5Sclose);
  if (H5Tget_class(t.get()) != H5T_INTEGER || H5Sget_simple_extent_npoints(s.get()) != 1)
    throw Problem{std::string("attribute ") + name + " is not a single integer"};
  std::uint64_t v = 0;
  if (H5Aread(a.get(), H5T_NATIVE_UINT64, &v) < 0)
    throw Problem{std::string("cannot read attribute ") + name + " (" + hdf5_error() + ")"};
  if (v > 0xFFFFFFFFull) throw Problem{std::string("attribute ") + name + " does not fit 32 bits"};
  return std::uint32_t(v);
}

// A string attribute: fixed-length (as written). Variable-length strings are refused rather
// than read: a damaged global heap can hang HDF5 (see write_attr_str).
std::string read_attr_str(hid_t obj, const char* name) {
  Hid a = open_attr(obj, name);
  Hid t(H5Aget_type(a.get()), H5Tclose);
  Hid s(H5Aget_space(a.get()), H5Sclose);
  if (H5Tget_class(t.get()) != H5T_STRING || H5Sget_simple_extent_npoints(s.get()) != 1)
    throw Problem{std::string("attribute ") + name + " is not a single string"};
  if (H5Tis_variable_str(t.get()) != 0)
    throw Problem{std::string("attribute ") + name + " is a variable-length string; checkpoints use fixed-length ones"};
  const std::size_t size = H5Tget_size(t.get());
  std::string buf(size, '\0');
  if (size > 0 && H5Aread(a.get(), t.get(), buf.data()) < 0)
    throw Problem{std::string("cannot read attribute ") + name + " (" + hdf5_error() + ")"};
  // Null-padded: the value ends at the first NUL (the text itself never holds one).
  buf.resize(std::strlen(buf.c_str()));
  return buf;
}

std::string join_lines(const std::vector<std::string>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "\n" : "") + v[i];
  return s;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  if (s.empty()) return out;
  std::size_t at = 0;
  while (true) {
    const auto nl = s.find('\n', at);
    out.push_back(s.substr(at, nl == std::string::npos ? std::string::npos : nl - at));
    if (nl == std::string::npos) break;
    at = nl + 1;
  }
  return out;
}

bool valid_extra_key(const std::string& k) {
  if (k.empty()) return false;
  for (char c : k)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

herr_t collect_attr_name(hid_t, const char* name, const H5A_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}

// Slash-separated non-empty parts, none "." or "..", no newline (the manifest's separator).
bool valid_dataset_name(const std::string& n) {
  if (n.empty() || n.find('\n') != std::string::npos) return false;
  std::size_t at = 0;
  while (true) {
    const auto slash = n.find('/', at);
    const std::string part = n.substr(at, slash == std::string::npos ? std::string::npos : slash - at);
    if (part.empty() || part == "." || part == "..") return false;
    if (slash == std::string::npos) return true;
    at = slash + 1;
  }
}

void walk_group(hid_t group, const std::string& prefix, std::vector<std::string>& out) {
  H5G_info_t gi;
  if (H5Gget_info(group, &gi) < 0) throw Problem{"cannot list group /" + prefix + " (" + hdf5_error() + ")"};
  for (hsize_t i = 0; i < gi.nlinks; ++i) {
    const ssize_t len = H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (len < 0) throw Problem{"cannot list group /" + prefix + " (" + hdf5_error() + ")"};
    std::string name(std::size_t(len) + 1, '\0');
    H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT);
    name.resize(std::size_t(len));
    const std::string path = prefix.empty() ? name : prefix + "/" + name;
    Hid obj(H5Oopen(group, name.c_str(), H5P_DEFAULT), H5Oclose);
    if (!obj.ok()) throw Problem{"cannot open /" + path + " (" + hdf5_error() + ")"};
    const H5I_type_t type = H5Iget_type(obj.get());
    if (type == H5I_GROUP) walk_group(obj.get(), path, out);
    else if (type == H5I_DATASET) out.push_back(path);
  }
}

// File access for checkpoint files: no HDF5 file locking (a checkpoint file has one writer,
// and is read only after its commit; flock fails on some cluster filesystems).
Hid file_access() {
  Hid fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
#if H5_VERSION_GE(1, 10, 7)
  H5Pset_file_locking(fapl.get(), false, true);
#endif
  H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG);
  return fapl;
}

}  // namespace

// ---- writing ------------------------------------------------------------------------------

std::string state_digest_text(const TrainState& st, const FileLayout& layout, std::int64_t format_version,
                              const std::vector<std::string>& manifest) {
  std::string t;
  auto line = [&](const std::string& k, const std::string& v) { t += k + "=" + v + "\n"; };
  line("format", kFormatName);
  line("format_version", std::to_string(format_version));
  line("step", std::to_string(st.step));
  line("consumed_tokens", std::to_string(st.consumed_tokens));
  line("optimizer_step", std::to_string(st.optimizer_step));
  line("sampler_position", st.sampler_position);
  line("rng", st.rng);
  line("config", st.config_toml);
  line("rank", std::to_string(layout.rank));
  line("num_files", std::to_string(layout.num_files));
  line("layout", layout.layout);
  line("datasets", join_lines(manifest));
  for (const auto& [k, v] : st.extra) line("extra." + k, v);  // std::map: sorted by key
  return t;
}

namespace {
// HDF5 closes the files still open at exit, from an atexit handler. A file whose write failed
// (a disk that filled during the write) cannot be closed, and HDF5 1.10 then crashes in that
// handler (SIGSEGV after our error message, exit code 139 instead of ours). Every file here is
// closed by its owner, so the handler has nothing to do: it is not installed. This must run
// before any other HDF5 call, hence at static initialisation. (Found and fixed on branch i14.)
[[maybe_unused]] const bool kNoHdf5AtExit = [] {
  H5dont_atexit();
  return true;
}();
}  // namespace

std::uintmax_t checkpoint_file_bytes(const std::vector<ShardSpec>& shards, const TrainState& state) {
  std::uintmax_t bytes = std::uintmax_t(1) << 20;
  for (const auto& s : shards) bytes += std::uintmax_t(shape_numel(s.shape)) * sizeof(float) + 4096;
  bytes += state.config_toml.size() + state.sampler_position.size() + state.rng.size();
  for (const auto& [k, v] : state.extra) bytes += k.size() + v.size();
  return bytes;
}

namespace {
// Refuses a write the disk cannot hold, before anything is written (a full disk in the middle
// of an HDF5 write ends in HDF5's raw error text).
void check_free_space(const fs::path& file, std::uintmax_t needed, std::int64_t step) {
  std::error_code ec;
  const fs::space_info sp = fs::space(file.parent_path(), ec);
  if (ec) return;  // no answer (an unusual file system): let the write report what happens
  if (sp.available >= needed) return;
  auto mib = [](std::uintmax_t b) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(1) << double(b) / double(1 << 20);
    return os.str();
  };
  throw EnvironmentError("checkpoint step " + std::to_string(step) + ": needs " + mib(needed) + " MiB, " +
                         mib(sp.available) + " MiB free in " + file.parent_path().parent_path().string() +
                         " (nothing written; the last committed checkpoint is intact)");
}
}  // namespace

void write_checkpoint_file(const fs::path& file, const std::vector<ShardSpec>& shards, const TrainState& state,
                           const FileLayout& layout) {
  const std::string where = file.string();
  if (layout.num_files < 1 || layout.rank < 0 || layout.rank >= layout.num_files)
    throw std::invalid_argument(where + ": bad file layout: rank " + std::to_string(layout.rank) + " of " +
                                std::to_string(layout.num_files));
  for (const auto& [k, v] : state.extra)
    if (!valid_extra_key(k)) throw std::invalid_argument("TrainState::extra key '" + k + "': use [A-Za-z0-9_]+");
  auto no_nul = [](const std::string& what, const std::string& v) {
    if (v.find('\0') != std::string::npos) throw std::invalid_argument(what + " holds a NUL character");
  };
  no_nul("sampler_position", state.sampler_position);
  no_nul("rng", state.rng);
  no_nul("config_toml", state.config_toml);
  no_nul("layout", layout.layout);
  for (const auto& [k, v] : state.extra) no_nul("extra." + k, v);
  check_free_space(file, checkpoint_file_bytes(shards, state), state.step);
  std::vector<std::string> manifest;
  for (const auto& s : shards) {
    if (!valid_dataset_name(s.name)) throw std::invalid_argument("bad dataset name '" + s.name + "'");
    if (std::find(manifest.begin(), manifest.end(), s.name) != manifest.end())
      throw std::invalid_argument("dataset '" + s.name + "' given twice");
    const std::size_t nd = s.global_shape.size();
    if (nd == 0 || s.offset.size() != nd || s.shape.size() != nd)
      throw std::invalid_argument(s.name + ": global_shape, offset and shape need the same rank >= 1");
    for (std::size_t d = 0; d < nd; ++d)
      if (s.offset[d] < 0 || s.shape[d] < 0 || s.offset[d] + s.shape[d] > s.global_shape[d])
        throw std::invalid_argument(s.name + ": shard " + shape_str(s.shape) + " at " + shape_str(s.offset) +
                                    " does not fit " + shape_str(s.global_shape));
    if (shape_numel(s.shape) > 0 && !s.data) throw std::invalid_argument(s.name + ": no data");
    manifest.push_back(s.name);
  }

  Quiet quiet;
  try {
    Hid fapl = file_access();
    // The 1.8 file format: object headers and the superblock carry HDF5's own checksums.
    H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_V18);
    Hid f(H5Fcreate(where.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl.get()), H5Fclose);
    if (!f.ok()) throw Problem{"cannot create (" + hdf5_error() + ")"};
    Hid lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
    H5Pset_create_intermediate_group(lcpl.get(), 1);
    for (const auto& s : shards) {
      try {
        std::vector<hsize_t> dims(s.shape.begin(), s.shape.end());
        Hid space(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose);
        Hid dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
        H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS);  // raw bytes in one run: H5Dget_offset finds them
        Hid ds(H5Dcreate2(f.get(), s.name.c_str(), H5T_IEEE_F32LE, space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT),
               H5Dclose);
        if (!ds.ok()) throw Problem{"cannot create dataset (" + hdf5_error() + ")"};
        const std::size_t n = std::size_t(shape_numel(s.shape));
        if (n > 0 && H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, s.data) < 0)
          throw Problem{"cannot write (" + hdf5_error() + ")"};
        write_attr_u32(ds.get(), "crc32", crc32(s.data, n * sizeof(float)));
        write_attr_i64s(ds.get(), "global_shape", s.global_shape);
        write_attr_i64s(ds.get(), "offset", s.offset);
      } catch (const Problem& p) {
        throw Problem{s.name + ": " + p.what};
      }
    }
    const hid_t root = f.get();
    write_attr_str(root, "format", kFormatName);
    write_attr_i64(root, "format_version", kFormatVersion);
    write_attr_i64(root, "step", state.step);
    write_attr_i64(root, "consumed_tokens", state.consumed_tokens);
    write_attr_i64(root, "optimizer_step", state.optimizer_step);
    write_attr_str(root, "sampler_position", state.sampler_position);
    write_attr_str(root, "rng", state.rng);
    write_attr_str(root, "config", state.config_toml);
    write_attr_i64(root, "rank", layout.rank);
    write_attr_i64(root, "num_files", layout.num_files);
    write_attr_str(root, "layout", layout.layout);
    write_attr_str(root, "datasets", join_lines(manifest));
    for (const auto& [k, v] : state.extra) write_attr_str(root, ("extra." + k).c_str(), v);
    write_attr_u32(root, "state_crc32", crc32(state_digest_text(state, layout, kFormatVersion, manifest)));
    if (H5Fflush(root, H5F_SCOPE_GLOBAL) < 0) throw Problem{"cannot flush (" + hdf5_error() + ")"};
  } catch (const Problem& p) {
    throw UserError(where + ": " + p.what);
  }
}

// ---- reading ------------------------------------------------------------------------------

CheckpointFile::CheckpointFile(const fs::path& file) : path_(file) {
  const std::string where = file.string();
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) throw UserError(where + ": missing");
  Quiet quiet;
  const hid_t f = H5Fopen(where.c_str(), H5F_ACC_RDONLY, file_access().get());
  if (f < 0) throw UserError(where + ": cannot open as HDF5: " + hdf5_error() + " (truncated or damaged?)");
  file_ = f;
  try {
    const std::string format = read_attr_str(f, "format");
    if (format != kFormatName) throw Problem{"attribute format is '" + format + "', not '" + kFormatName + "'"};
    version_ = read_attr_i64(f, "format_version");
    if (version_ < 1 || version_ > kFormatVersion)
      throw Problem{"format_version " + std::to_string(version_) + ": this build reads versions 1 to " +
                    std::to_string(kFormatVersion)};
    state_.step = read_attr_i64(f, "step");
    state_.consumed_tokens = read_attr_i64(f, "consumed_tokens");
    state_.optimizer_step = read_attr_i64(f, "optimizer_step");
    state_.sampler_position = read_attr_str(f, "sampler_position");
    state_.rng = read_attr_str(f, "rng");
    state_.config_toml = read_attr_str(f, "config");
    layout_.rank = read_attr_i64(f, "rank");
    layout_.num_files = read_attr_i64(f, "num_files");
    layout_.layout = read_attr_str(f, "layout");
    manifest_ = split_lines(read_attr_str(f, "datasets"));
    // extra.* attributes
    std::vector<std::string> names;
    hsize_t idx = 0;
    if (H5Aiterate2(f, H5_INDEX_NAME, H5_ITER_INC, &idx, collect_attr_name, &names) < 0)
      throw Problem{"cannot list root attributes (" + hdf5_error() + ")"};
    for (const auto& name : names)
      if (name.rfind("extra.", 0) == 0) state_.extra[name.substr(6)] = read_attr_str(f, name.c_str());
    const std::uint32_t stored = read_attr_u32(f, "state_crc32");
    const std::uint32_t computed = crc32(state_digest_text(state_, layout_, version_, manifest_));
    if (stored != computed) {
      std::ostringstream os;
      os << "root attributes: checksum mismatch (state_crc32 0x" << std::hex << stored << ", computed 0x" << computed
         << "): the step, config, sampler position or manifest is damaged";
      throw Problem{os.str()};
    }
  } catch (const Problem& p) {
    H5Fclose(file_);
    file_ = -1;
    throw UserError(where + ": " + p.what);
  }
}

CheckpointFile::CheckpointFile(CheckpointFile&& o) noexcept
    : path_(std::move(o.path_)), file_(o.file_), state_(std::move(o.state_)), layout_(std::move(o.layout_)),
      version_(o.version_), manifest_(std::move(o.manifest_)) {
  o.file_ = -1;
}

CheckpointFile::~CheckpointFile() {
  if (file_ >= 0) {
    Quiet quiet;
    H5Fclose(file_);
  }
}

bool CheckpointFile::lists(const std::string& name) const {
  return std::find(manifest_.begin(), manifest_.end(), name) != manifest_.end();
}

std::vector<std::string> CheckpointFile::datasets_in_file() const {
  Quiet quiet;
  std::vector<std::string> out;
  try {
    walk_group(file_, "", out);
  } catch (const Problem& p) {
    throw UserError(path_.string() + ": " + p.what);
  }
  std::sort(out.begin(), out.end());
  return out;
}

DatasetInfo CheckpointFile::info(const std::string& name) const {
  Quiet quiet;
  DatasetInfo di;
  di.name = name;
  try {
    // Walk the path one link at a time: H5Lexists fails on a missing intermediate group.
    std::string prefix;
    for (std::size_t at = 0;;) {
      const auto slash = name.find('/', at);
      prefix = name.substr(0, slash);
      if (H5Lexists(file_, prefix.c_str(), H5P_DEFAULT) <= 0) throw Problem{"dataset is missing"};
      if (slash == std::string::npos) break;
      at = slash + 1;
    }
    Hid ds(H5Dopen2(file_, name.c_str(), H5P_DEFAULT), H5Dclose);
    if (!ds.ok()) throw Problem{"not a readable dataset (" + hdf5_error() + ")"};
    Hid t(H5Dget_type(ds.get()), H5Tclose);
    if (H5Tequal(t.get(), H5T_IEEE_F32LE) > 0) di.dtype = "fp32";
    else throw Problem{"not float32 little-endian"};
    Hid s(H5Dget_space(ds.get()), H5Sclose);
    const int nd = H5Sget_simple_extent_ndims(s.get());
    if (nd < 1) throw Problem{"not an array"};
    std::vector<hsize_t> dims(std::size_t(nd), 0);
    H5Sget_simple_extent_dims(s.get(), dims.data(), nullptr);
    for (hsize_t d : dims) di.shape.push_back(std::int64_t(d));
    di.crc32 = read_attr_u32(ds.get(), "crc32");
    di.global_shape = read_attr_ints(ds.get(), "global_shape");
    di.offset = read_attr_ints(ds.get(), "offset");
    if (di.global_shape.size() != di.shape.size() || di.offset.size() != di.shape.size())
      throw Problem{"global_shape " + shape_str(di.global_shape) + " and offset " + shape_str(di.offset) +
                    " must have the rank of the dataset " + shape_str(di.shape)};
    for (std::size_t d = 0; d < di.shape.size(); ++d)
      if (di.offset[d] < 0 || di.offset[d] + di.shape[d] > di.global_shape[d])
        throw Problem{"shard " + shape_str(di.shape) + " at offset " + shape_str(di.offset) +
                      " does not fit global_shape " + shape_str(di.global_shape)};
  } catch (const Problem& p) {
    throw UserError(path_.string() + ": " + name + ": " + p.what);
  }
  return di;
}

void CheckpointFile::read(const DatasetInfo& di, float* out) const {
  Quiet quiet;
  const std::size_t n = std::size_t(shape_numel(di.shape));
  Hid ds(H5Dopen2(file_, di.name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!ds.ok()) throw UserError(path_.string() + ": " + di.name + ": cannot open (" + hdf5_error() + ")");
  if (n > 0 && H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
    throw UserError(path_.string() + ": " + di.name + ": cannot read (" + hdf5_error() + ")");
  const std::uint32_t computed = crc32(out, n * sizeof(float));
  if (computed != di.crc32) {
    std::ostringstream os;
    os << path_.string() << ": " << di.name << ": checksum mismatch (crc32 attribute 0x" << std::hex << di.crc32
       << ", data 0x" << computed << "): the data is damaged";
    throw UserError(os.str());
  }
}

}  // namespace nsatron::checkpoint

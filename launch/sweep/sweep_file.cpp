// Reading a sweep file and expanding its grid (sweep_file.h).
#include "launch/sweep/sweep_file.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/config/toml_text.h"
#include "core/model/model.h"
#include "core/model/plan.h"

namespace nsatron::sweep {

namespace fs = std::filesystem;

namespace {

// "1.5e+15" -> "1.5e15", 100000 -> "100k": short, file-name-safe numbers for run names.
std::string short_number(double v) {
  char buf[64];
  const double a = std::fabs(v);
  auto whole = [](double x) { return std::fabs(x - std::round(x)) < 1e-9 * std::max(1.0, std::fabs(x)); };
  if (a >= 1e6 && a < 1e12 && whole(v / 1e6 * 1000)) std::snprintf(buf, sizeof buf, "%gM", v / 1e6);
  else if (a >= 1e3 && a < 1e6 && whole(v / 1e3 * 1000)) std::snprintf(buf, sizeof buf, "%gk", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%g", v);
  std::string s = buf;
  if (auto e = s.find("e+"); e != std::string::npos) s.erase(e + 1, 1);
  return s;
}

// Letters, digits, '.', '-' (and '_' when `underscore`: '_' joins the parts of a run's name)
// kept; anything else becomes '-'.
std::string safe_label(const std::string& s, bool underscore = false) {
  std::string out;
  for (char c : s)
    out += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || (underscore && c == '_')) ? c : '-';
  return out.empty() ? "-" : out;
}

// The value's label in a run name: strings as they are, numbers short.
std::string value_label(const toml::node& n) {
  if (n.is_string()) return safe_label(n.as_string()->get());
  if (n.is_integer()) return short_number(double(n.as_integer()->get()));
  if (n.is_floating_point()) return short_number(n.as_floating_point()->get());
  return safe_label(toml_value_text(n));
}

// Entries of a table in the order they appear in the file (toml++ keeps them sorted by key).
template <class Table> std::vector<std::pair<std::string, const toml::node*>> in_file_order(const Table& t) {
  std::vector<std::pair<std::string, const toml::node*>> items;
  std::vector<std::pair<toml::source_position, std::size_t>> order;
  for (auto&& [k, n] : t) {
    order.push_back({k.source().begin, items.size()});
    items.push_back({std::string(k.str()), &n});
  }
  std::vector<std::pair<std::string, const toml::node*>> sorted;
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.first.line != b.first.line ? a.first.line < b.first.line : a.first.column < b.first.column;
  });
  for (const auto& o : order) sorted.push_back(items[o.second]);
  return sorted;
}

struct Reader {
  std::string file;
  std::vector<std::string> errors;
  void error(const toml::node& at, const std::string& key, const std::string& msg) {
    errors.push_back(toml_position(file, at.source()) + ": " + key + ": " + msg);
  }
  void error_at(const toml::source_region& at, const std::string& key, const std::string& msg) {
    errors.push_back(toml_position(file, at) + ": " + key + ": " + msg);
  }

  // A config key ("section.key") and a value: an override, or an error when the key has no dot
  // (the run config checks the key itself when the runs are expanded).
  bool config_override(const std::string& key, const toml::node& value, const std::string& where,
                       std::vector<LocatedOverride>& out) {
    if (key.find('.') == std::string::npos || key.front() == '.' || key.back() == '.') {
      error(value, where, "'" + key + "' is not a config key of the form \"section.key\"");
      return false;
    }
    if (value.is_table()) {
      error(value, where, "expected a value for " + key + ", got a table");
      return false;
    }
    out.push_back({key + "=" + toml_value_text(value), toml_position(file, value.source())});
    return true;
  }

  // { tokens = N } | { tokens_per_param = X } | { flops = F }: exactly one, above zero.
  Budget budget(const toml::node& n, const std::string& where) {
    Budget b;
    if (!n.is_table()) {
      error(n, where, "a budget is a table: { tokens = N }, { tokens_per_param = X } or { flops = F }; got " +
                          toml_type_name(n));
      return b;
    }
    const auto& t = *n.as_table();
    if (t.size() != 1) {
      error(n, where, "a budget has exactly one of tokens, tokens_per_param, flops (got " + std::to_string(t.size()) +
                          " keys)");
      return b;
    }
    const toml::key* key = nullptr;
    const toml::node* node = nullptr;
    for (auto&& [k, n_] : t) key = &k, node = &n_;  // the one entry
    const toml::key& k = *key;
    const toml::node& v = *node;
    const std::string name(k.str());
    if (name == "tokens") b.kind = Budget::Kind::Tokens;
    else if (name == "tokens_per_param") b.kind = Budget::Kind::TokensPerParam;
    else if (name == "flops") b.kind = Budget::Kind::Flops;
    else {
      error_at(k.source(), where + "." + name, "unknown budget key (one of tokens, tokens_per_param, flops)");
      return Budget{};
    }
    if (!v.is_number()) {
      error(v, where + "." + name, "expected a number, got " + toml_type_name(v));
      return Budget{};
    }
    b.value = v.is_integer() ? double(v.as_integer()->get()) : v.as_floating_point()->get();
    if (!(b.value > 0) || !std::isfinite(b.value)) {
      error(v, where + "." + name, "must be above zero, got " + toml_value_text(v));
      return Budget{};
    }
    return b;
  }

  void read_sweep_section(const toml::table& t, Sweep& s) {
    static const std::set<std::string> known = {"name", "base", "out", "ranks", "budget"};
    for (auto&& [k, n] : t) {
      const std::string key(k.str()), path = "sweep." + key;
      if (!known.count(key)) {
        error_at(k.source(), path, "unknown key (one of name, base, out, ranks, budget)");
        continue;
      }
      if (key == "budget") {
        s.budget = budget(n, path);
      } else if (key == "ranks") {
        if (!n.is_integer()) error(n, path, "expected an integer, got " + toml_type_name(n));
        else if (n.as_integer()->get() < 1) error(n, path, "must be at least 1, got " + toml_value_text(n));
        else s.ranks = n.as_integer()->get();
      } else if (!n.is_string()) {
        error(n, path, "expected a string, got " + toml_type_name(n));
      } else if (n.as_string()->get().empty()) {
        error(n, path, "must not be empty");
      } else {
        const std::string v = n.as_string()->get();
        if (key == "name") {
          if (safe_label(v, true) != v) error(n, path, "\"" + v + "\" is not a plain name (letters, digits, '.', '-', '_')");
          s.name = v;
        } else if (key == "base") {
          s.base = v;
        } else {
          s.out = v;
        }
      }
    }
  }

  void read_axes(const toml::table& t, Sweep& s) {
    for (const auto& [name, node] : in_file_order(t)) {
      const toml::node& n = *node;
      const std::string where = "axes." + (name.find('.') != std::string::npos ? "\"" + name + "\"" : name);
      if (!n.is_array()) {
        error(n, where, "an axis is an array of values, got " + toml_type_name(n));
        continue;
      }
      const auto& values = *n.as_array();
      if (values.empty()) {
        error(n, where, "an axis needs at least one value (this one is empty)");
        continue;
      }
      Axis axis;
      axis.name = name;
      std::set<std::string> labels;
      if (name == "budget") {
        for (const auto& v : values) {
          AxisValue av;
          av.budget = budget(v, where);
          av.label = av.budget.label();
          axis.values.push_back(av);
        }
      } else if (name.find('.') != std::string::npos) {  // a key axis
        axis.prefix = safe_label(name.substr(name.rfind('.') + 1), true);
        for (const auto& v : values) {
          AxisValue av;
          av.label = value_label(v);
          config_override(name, v, where, av.overrides);
          axis.values.push_back(av);
        }
      } else {  // a grouped axis: tables of "section.key" = value, and an optional name
        axis.prefix = safe_label(name);
        std::size_t index = 0;
        for (const auto& v : values) {
          AxisValue av;
          av.label = std::to_string(index++);
          if (!v.is_table()) {
            error(v, where, "a grouped axis (a name without a dot) takes tables of \"section.key\" = value; got " +
                                toml_type_name(v) + " (for one key, name the axis by the key: \"model.d_model\" = [...])");
            axis.values.push_back(av);
            continue;
          }
          for (const auto& [key, value] : in_file_order(*v.as_table())) {
            if (key == "name") {
              if (!value->is_string() || value->as_string()->get().empty())
                error(*value, where + ".name", "expected a non-empty string, got " + toml_value_text(*value));
              else av.label = safe_label(value->as_string()->get());
              continue;
            }
            config_override(key, *value, where, av.overrides);
          }
          if (av.overrides.empty()) error(v, where, "this entry sets no key");
          axis.values.push_back(av);
        }
      }
      for (const auto& av : axis.values)
        if (!labels.insert(av.label).second)
          error(n, where, "two values have the label '" + av.label + "': runs would share a name" +
                              (axis.prefix.empty() || name.find('.') != std::string::npos ? "" : " (give each entry a distinct name)"));
      s.axes.push_back(std::move(axis));
    }
  }
};

}  // namespace

std::string Budget::label() const {
  switch (kind) {
    case Kind::None: return "";
    case Kind::Tokens: return "tok-" + short_number(value);
    case Kind::TokensPerParam: return "tpp-" + short_number(value);
    case Kind::Flops: return "flops-" + short_number(value);
  }
  return "";
}

Sweep parse_sweep(const std::string& text, const std::string& path) {
  Reader r{path, {}};
  toml::table root;
  try {
    root = toml::parse(text, std::string_view(path));
  } catch (const toml::parse_error& e) {
    throw SweepError({toml_position(path, e.source()) + ": TOML syntax error: " + std::string(e.description())});
  }
  Sweep s;
  s.file = path;
  for (auto&& [k, n] : root) {
    const std::string sec(k.str());
    if (sec != "sweep" && sec != "set" && sec != "axes") {
      r.error_at(k.source(), sec, "unknown section (one of [sweep], [set], [axes])");
      continue;
    }
    if (!n.is_table()) {
      r.error(n, sec, "must be a table ([" + sec + "]), got " + toml_type_name(n));
      continue;
    }
    if (sec == "sweep") r.read_sweep_section(*n.as_table(), s);
    else if (sec == "set")
      for (const auto& [key, value] : in_file_order(*n.as_table())) r.config_override(key, *value, "set." + key, s.set);
    else r.read_axes(*n.as_table(), s);
  }
  if (s.base.empty() && !root.contains("sweep"))
    r.errors.push_back(path + ":1:1: sweep.base: missing: name the run config every run starts from ([sweep] base = \"...\")");
  else if (s.base.empty() && r.errors.empty())
    r.error(*root.get("sweep"), "sweep.base", "missing: name the run config every run starts from (base = \"...\")");
  bool budget_axis = false;
  for (const auto& a : s.axes) budget_axis = budget_axis || a.name == "budget";
  if (budget_axis && s.budget.kind != Budget::Kind::None)
    r.error(*root.get("sweep"), "sweep.budget", "given both here and as the axis \"budget\": keep one");
  if (!r.errors.empty()) {
    auto line_col = [&](const std::string& e) {
      long line = 0, col = 0;
      std::sscanf(e.c_str() + std::min(e.size(), path.size() + 1), "%ld:%ld", &line, &col);
      return std::pair(line, col);
    };
    std::stable_sort(r.errors.begin(), r.errors.end(),
                     [&](const std::string& a, const std::string& b) { return line_col(a) < line_col(b); });
    throw SweepError(r.errors);
  }
  if (s.name.empty()) s.name = safe_label(fs::path(path).stem().string(), true);
  const fs::path base(s.base);
  s.base = base.is_absolute() ? base.string() : (fs::path(path).parent_path() / base).lexically_normal().string();
  if (s.out.empty()) s.out = "runs/" + s.name;
  return s;
}

bool read_whole_file(const std::string& path, std::string& text) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  text = ss.str();
  return true;
}

Sweep read_sweep(const std::string& path) {
  std::string text;
  if (!read_whole_file(path, text)) throw SweepError({path + ": cannot open the sweep file"});
  return parse_sweep(text, path);
}

std::vector<PlannedRun> expand(const Sweep& sweep) {
  std::string base_text;
  if (!read_whole_file(sweep.base, base_text))
    throw SweepError({sweep.file + ": sweep.base: cannot open the base config '" + sweep.base + "'"});

  std::size_t count = 1;
  for (const auto& a : sweep.axes) count *= a.values.size();
  std::vector<PlannedRun> runs;
  std::vector<std::string> errors;
  std::set<std::string> seen_errors;
  for (std::size_t index = 0; index < count; ++index) {
    // The grid point: the first axis outermost.
    std::vector<const AxisValue*> point(sweep.axes.size());
    for (std::size_t i = sweep.axes.size(), rest = index; i-- > 0;) {
      point[i] = &sweep.axes[i].values[rest % sweep.axes[i].values.size()];
      rest /= sweep.axes[i].values.size();
    }
    PlannedRun run;
    run.budget = sweep.budget;
    std::vector<LocatedOverride> overrides = sweep.set;
    for (std::size_t i = 0; i < point.size(); ++i) {
      const Axis& a = sweep.axes[i];
      run.axis_labels.push_back(point[i]->label);
      run.name += (run.name.empty() ? "" : "_") + (a.prefix.empty() ? point[i]->label : a.prefix + "-" + point[i]->label);
      overrides.insert(overrides.end(), point[i]->overrides.begin(), point[i]->overrides.end());
      if (a.name == "budget") run.budget = point[i]->budget;
    }
    if (run.name.empty()) run.name = "run";
    run.dir = (fs::path(sweep.out) / run.name).string();
    const std::string origin = sweep.file + " (run " + run.name + ")";
    overrides.push_back({"checkpoint.dir=\"" + run.dir + "/checkpoints\"", origin});
    overrides.push_back({"log.metrics=\"" + run.dir + "/metrics.jsonl\"", origin});
    overrides.push_back({"checkpoint.resume=\"auto\"", origin});
    try {
      // First without the world (to learn tp * pp), then for the run's ranks.
      const RunConfig layout = parse_config_with_origins(base_text, sweep.base, overrides, 0);
      run.ranks = sweep.ranks > 0 ? sweep.ranks : layout.parallel.tp * layout.parallel.pp;
      run.config = parse_config_with_origins(base_text, sweep.base, overrides, run.ranks);
      const ModelDims dims = ModelDims::from_config(run.config);
      const ParameterCount count = count_parameters(dims);
      run.params = count.total;
      run.params_nonembed = count.non_embedding();
      run.tokens_per_step = run.config.train.global_batch * run.config.train.seq_len;
      run.flops_per_token = dims.flops_per_token(run.config.train.seq_len);
      double tokens = 0;
      switch (run.budget.kind) {
        case Budget::Kind::None: break;
        case Budget::Kind::Tokens: tokens = run.budget.value; break;
        case Budget::Kind::TokensPerParam: tokens = run.budget.value * double(run.params); break;
        case Budget::Kind::Flops: tokens = run.budget.value / run.flops_per_token; break;
      }
      if (run.budget.kind != Budget::Kind::None)
        run.config.train.steps = std::max<std::int64_t>(1, std::llround(tokens / double(run.tokens_per_step)));
      run.tokens = run.config.train.steps * run.tokens_per_step;
      run.flops = double(run.tokens) * run.flops_per_token;
    } catch (const ConfigError& e) {
      for (const auto& m : e.messages)
        if (seen_errors.insert(m).second) errors.push_back("run " + run.name + ": " + m);
    } catch (const UserError& e) {
      errors.push_back("run " + run.name + ": " + e.what());
    }
    runs.push_back(std::move(run));
  }
  if (!errors.empty()) throw SweepError(errors);
  return runs;
}

}  // namespace nsatron::sweep

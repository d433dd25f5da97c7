#include "cohort/core/config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>

#include <toml++/toml.h>

#include "cohort/core/error.h"

namespace cohort {
namespace {

// Edit distance, for "did you mean" hints on unknown keys.
std::size_t distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t prev = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t cur = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, prev + (a[i - 1] == b[j - 1] ? 0 : 1)});
      prev = cur;
    }
  }
  return row[b.size()];
}

std::string closest_keys(const ConfigSchema& schema, std::string_view key) {
  std::vector<std::pair<std::size_t, std::string>> scored;
  for (const auto& o : schema.options()) scored.emplace_back(distance(key, o.key), o.key);
  std::sort(scored.begin(), scored.end());
  std::string out;
  for (std::size_t i = 0; i < scored.size() && i < 3; ++i) {
    out += (i ? ", " : "") + scored[i].second;
  }
  return out;
}

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t");
  return std::string(s.substr(b, e - b + 1));
}

std::optional<Value> parse_as(ValueType type, std::string_view raw) {
  const std::string text = trim(raw);
  switch (type) {
    case ValueType::kBool:
      if (text == "true" || text == "1" || text == "on" || text == "yes") return Value{true};
      if (text == "false" || text == "0" || text == "off" || text == "no") return Value{false};
      return std::nullopt;
    case ValueType::kInt: {
      std::int64_t v = 0;
      auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (ec != std::errc() || p != text.data() + text.size() || text.empty()) return std::nullopt;
      return Value{v};
    }
    case ValueType::kDouble: {
      double v = 0;
      auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (ec != std::errc() || p != text.data() + text.size() || text.empty() || !std::isfinite(v))
        return std::nullopt;
      return Value{v};
    }
    case ValueType::kString: {
      std::string s = text;
      if (s.size() >= 2 &&
          ((s.front() == '"' && s.back() == '"') || (s.front() == '\'' && s.back() == '\''))) {
        s = s.substr(1, s.size() - 2);
      }
      return Value{s};
    }
  }
  return std::nullopt;
}

// Free-form (plug-in) values typed from text: numbers first, then the literals true/false.
Value guess(std::string_view raw) {
  for (ValueType t : {ValueType::kInt, ValueType::kDouble}) {
    if (auto v = parse_as(t, raw)) return *v;
  }
  const std::string text = trim(raw);
  if (text == "true") return Value{true};
  if (text == "false") return Value{false};
  return *parse_as(ValueType::kString, raw);
}

// Ints are accepted where doubles are declared; nothing else converts.
std::optional<Value> coerce(ValueType want, const Value& v) {
  if (type_of(v) == want) return v;
  if (want == ValueType::kDouble && type_of(v) == ValueType::kInt) {
    return Value{static_cast<double>(std::get<std::int64_t>(v))};
  }
  return std::nullopt;
}

void flatten(const toml::table& table, const std::string& prefix, std::string_view origin,
             std::vector<std::pair<std::string, Value>>& out) {
  for (const auto& [k, node] : table) {
    const std::string key =
        prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const auto* t = node.as_table()) {
      flatten(*t, key, origin, out);
    } else if (auto b = node.value<bool>(); node.is_boolean()) {
      out.emplace_back(key, Value{*b});
    } else if (node.is_integer()) {
      out.emplace_back(key, Value{*node.value<std::int64_t>()});
    } else if (node.is_floating_point()) {
      out.emplace_back(key, Value{*node.value<double>()});
    } else if (node.is_string()) {
      out.emplace_back(key, Value{*node.value<std::string>()});
    } else {
      throw ConfigError(std::string(origin) + ": key '" + key +
                        "' has an unsupported value type (use a bool, number or string)");
    }
  }
}

}  // namespace

std::string_view type_name(ValueType type) {
  switch (type) {
    case ValueType::kBool: return "bool";
    case ValueType::kInt: return "int";
    case ValueType::kDouble: return "float";
    case ValueType::kString: return "string";
  }
  return "?";
}

ValueType type_of(const Value& value) { return static_cast<ValueType>(value.index()); }

std::string to_string(const Value& value) {
  switch (type_of(value)) {
    case ValueType::kBool: return std::get<bool>(value) ? "true" : "false";
    case ValueType::kInt: return std::to_string(std::get<std::int64_t>(value));
    case ValueType::kDouble: {
      std::ostringstream os;
      os << std::get<double>(value);
      return os.str();
    }
    case ValueType::kString: return '"' + std::get<std::string>(value) + '"';
  }
  return {};
}

ConfigSchema& ConfigSchema::add(std::string key, Value default_value, std::string help) {
  COHORT_CHECK(find(key) == nullptr) << "config key declared twice: " << key;
  const ValueType type = type_of(default_value);
  options_.push_back({std::move(key), type, std::move(default_value), std::move(help), false});
  return *this;
}

ConfigSchema& ConfigSchema::add_secret(std::string key, Value default_value, std::string help) {
  add(std::move(key), std::move(default_value), std::move(help));
  options_.back().secret = true;
  return *this;
}

ConfigSchema& ConfigSchema::add_section(std::string prefix, std::string help) {
  sections_[std::move(prefix)] = std::move(help);
  return *this;
}

const OptionSpec* ConfigSchema::find(std::string_view key) const {
  for (const auto& o : options_) {
    if (o.key == key) return &o;
  }
  return nullptr;
}

bool ConfigSchema::in_free_section(std::string_view key) const {
  for (const auto& [prefix, help] : sections_) {
    if (key.size() > prefix.size() + 1 && key.starts_with(prefix) && key[prefix.size()] == '.')
      return true;
  }
  return false;
}

std::string ConfigSchema::help_text() const {
  std::ostringstream os;
  for (const auto& o : options_) {
    os << "  " << o.key << " = " << (o.secret ? "<secret>" : to_string(o.default_value)) << "  ("
       << type_name(o.type) << ") " << o.help << '\n';
  }
  for (const auto& [prefix, help] : sections_) {
    os << "  " << prefix << ".*  (plug-in options) " << help << '\n';
  }
  return os.str();
}

std::string ConfigSection::get_string(std::string_view name, std::string fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  if (type_of(it->second) != ValueType::kString) {
    // A free-form value that looked like a number is still usable as text.
    std::string s = to_string(it->second);
    return s;
  }
  return std::get<std::string>(it->second);
}

std::int64_t ConfigSection::get_int(std::string_view name, std::int64_t fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  if (type_of(it->second) != ValueType::kInt) {
    throw ConfigError("config key '" + prefix_ + "." + std::string(name) +
                      "' must be an int, got " + to_string(it->second));
  }
  return std::get<std::int64_t>(it->second);
}

double ConfigSection::get_double(std::string_view name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  if (auto v = coerce(ValueType::kDouble, it->second)) return std::get<double>(*v);
  throw ConfigError("config key '" + prefix_ + "." + std::string(name) +
                    "' must be a number, got " + to_string(it->second));
}

bool ConfigSection::get_bool(std::string_view name, bool fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  if (type_of(it->second) != ValueType::kBool) {
    throw ConfigError("config key '" + prefix_ + "." + std::string(name) +
                      "' must be a bool, got " + to_string(it->second));
  }
  return std::get<bool>(it->second);
}

std::vector<std::string> ConfigSection::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : values_) out.push_back(k);
  return out;
}

void ConfigSection::require_known(std::span<const std::string_view> known) const {
  for (const auto& [k, v] : values_) {
    if (std::find(known.begin(), known.end(), k) == known.end()) {
      std::string list;
      for (auto n : known) list += (list.empty() ? "" : ", ") + std::string(n);
      throw ConfigError("unknown config key '" + prefix_ + "." + k +
                        "' (known: " + (list.empty() ? "none" : list) + ")");
    }
  }
}

Config::Config(const ConfigSchema& schema) : schema_(std::make_shared<ConfigSchema>(schema)) {
  for (const auto& o : schema_->options()) values_[o.key] = o.default_value;
}

Config Config::load(const ConfigSchema& schema, const std::optional<std::filesystem::path>& file,
                    std::span<const std::string> overrides) {
  Config config(schema);
  if (file) {
    std::ifstream in(*file, std::ios::binary);
    if (!in) throw ConfigError("cannot read config file " + file->string());
    std::ostringstream text;
    text << in.rdbuf();
    config.merge_toml(text.str(), file->string());
  }
  for (const auto& o : overrides) config.apply_override(o);
  return config;
}

void Config::merge_toml(std::string_view text, std::string_view origin) {
  toml::table table;
  try {
    table = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    const auto& src = e.source();
    throw ConfigError(std::string(origin) + ":" + std::to_string(src.begin.line) + ":" +
                      std::to_string(src.begin.column) + ": " + std::string(e.description()));
  }
  std::vector<std::pair<std::string, Value>> flat;
  flatten(table, "", origin, flat);
  for (auto& [k, v] : flat) store(k, std::move(v), origin);
}

void Config::apply_override(std::string_view assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string_view::npos) {
    throw ConfigError("override '" + std::string(assignment) +
                      "' must look like section.key=value");
  }
  set(trim(assignment.substr(0, eq)), assignment.substr(eq + 1));
}

void Config::set(std::string_view key, std::string_view text) {
  if (const OptionSpec* spec = schema_->find(key)) {
    auto v = parse_as(spec->type, text);
    if (!v) {
      throw ConfigError("config key '" + std::string(key) + "' must be a " +
                        std::string(type_name(spec->type)) + ", got '" + trim(text) + "'");
    }
    store(key, std::move(*v), "override");
    return;
  }
  store(key, guess(text), "override");
}

void Config::set_value(std::string_view key, Value value) { store(key, std::move(value), "code"); }

void Config::store(std::string_view key, Value value, std::string_view origin) {
  if (const OptionSpec* spec = schema_->find(key)) {
    auto v = coerce(spec->type, value);
    if (!v) {
      throw ConfigError(std::string(origin) + ": config key '" + std::string(key) + "' must be a " +
                        std::string(type_name(spec->type)) + ", got " + to_string(value));
    }
    values_[std::string(key)] = std::move(*v);
  } else if (schema_->in_free_section(key)) {
    values_[std::string(key)] = std::move(value);
  } else {
    throw ConfigError(std::string(origin) + ": unknown config key '" + std::string(key) +
                      "' (closest valid keys: " + closest_keys(*schema_, key) + ")");
  }
  explicit_[std::string(key)] = true;
}

const Value& Config::lookup(std::string_view key, ValueType type) const {
  auto it = values_.find(key);
  if (it == values_.end()) {
    throw InternalError("config key '" + std::string(key) + "' read but never declared");
  }
  if (type_of(it->second) != type) {
    throw InternalError("config key '" + std::string(key) + "' read as " +
                        std::string(type_name(type)) + " but declared " +
                        std::string(type_name(type_of(it->second))));
  }
  return it->second;
}

bool Config::get_bool(std::string_view key) const {
  return std::get<bool>(lookup(key, ValueType::kBool));
}
std::int64_t Config::get_int(std::string_view key) const {
  return std::get<std::int64_t>(lookup(key, ValueType::kInt));
}
double Config::get_double(std::string_view key) const {
  return std::get<double>(lookup(key, ValueType::kDouble));
}
const std::string& Config::get_string(std::string_view key) const {
  return std::get<std::string>(lookup(key, ValueType::kString));
}

ConfigSection Config::section(std::string_view prefix) const {
  std::map<std::string, Value, std::less<>> out;
  const std::string p = std::string(prefix) + ".";
  for (const auto& [k, v] : values_) {
    if (k.starts_with(p)) out[k.substr(p.size())] = v;
  }
  return ConfigSection(std::string(prefix), std::move(out));
}

bool Config::is_set(std::string_view key) const { return explicit_.contains(key); }

std::string Config::dump() const {
  std::ostringstream os;
  for (const auto& [k, v] : values_) {
    const OptionSpec* spec = schema_->find(k);
    os << k << " = " << (spec && spec->secret ? "\"<redacted>\"" : to_string(v)) << '\n';
  }
  return os.str();
}

}  // namespace cohort

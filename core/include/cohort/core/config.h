// Configuration: defaults in code < a TOML file (--config FILE) < --set key=value overrides.
//
// Keys are dotted paths ("server.rounds", "tls.ca_file"); the TOML file may write them as tables
// ([server] rounds = 100), dotted keys or inline tables. Every key must be declared in a
// ConfigSchema with its type, default and help text; an unknown key or a value of the wrong type
// is a ConfigError naming the key (and, for unknown keys, the closest valid ones). Keys under a
// declared free-form section ("aggregator.*") are left for a plug-in to read through
// ConfigSection. Secrets are declared as such and redacted from dump().
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace cohort {

enum class ValueType { kBool, kInt, kDouble, kString };
using Value = std::variant<bool, std::int64_t, double, std::string>;

std::string_view type_name(ValueType type);
ValueType type_of(const Value& value);
std::string to_string(const Value& value);

struct OptionSpec {
  std::string key;
  ValueType type;
  Value default_value;
  std::string help;
  bool secret = false;
};

// The table of every key a program accepts. Not thread-safe while being built; immutable after.
class ConfigSchema {
 public:
  // The type is the default's. Throws InternalError if the key is declared twice.
  ConfigSchema& add(std::string key, Value default_value, std::string help);
  ConfigSchema& add_secret(std::string key, Value default_value, std::string help);
  // Accepts any key "prefix.*" with any scalar value; read through Config::section(prefix).
  ConfigSchema& add_section(std::string prefix, std::string help);

  [[nodiscard]] const OptionSpec* find(std::string_view key) const;
  [[nodiscard]] bool in_free_section(std::string_view key) const;
  [[nodiscard]] const std::vector<OptionSpec>& options() const { return options_; }
  // One line per key: "  server.rounds = 100  (int) rounds to run".
  [[nodiscard]] std::string help_text() const;

 private:
  std::vector<OptionSpec> options_;
  std::map<std::string, std::string, std::less<>> sections_;  // prefix -> help
};

// The keys of one free-form section, for a plug-in. Getters throw ConfigError naming the full key
// when a value has the wrong type; `with default` getters return the default when it is absent.
class ConfigSection {
 public:
  ConfigSection() = default;
  ConfigSection(std::string prefix, std::map<std::string, Value, std::less<>> values)
      : prefix_(std::move(prefix)), values_(std::move(values)) {}

  [[nodiscard]] bool has(std::string_view name) const { return values_.contains(name); }
  [[nodiscard]] std::string get_string(std::string_view name, std::string fallback) const;
  [[nodiscard]] std::int64_t get_int(std::string_view name, std::int64_t fallback) const;
  [[nodiscard]] double get_double(std::string_view name, double fallback) const;
  [[nodiscard]] bool get_bool(std::string_view name, bool fallback) const;
  [[nodiscard]] std::vector<std::string> names() const;
  // Throws ConfigError naming any key not in `known` (a plug-in's own unknown-key check).
  void require_known(std::span<const std::string_view> known) const;
  [[nodiscard]] const std::string& prefix() const { return prefix_; }
  // A copy with `name` set to `value` (a default the edge fills in before a factory reads it).
  [[nodiscard]] ConfigSection with(std::string name, Value value) const {
    ConfigSection out = *this;
    out.values_.insert_or_assign(std::move(name), std::move(value));
    return out;
  }

 private:
  std::string prefix_;
  std::map<std::string, Value, std::less<>> values_;
};

// A validated configuration. Copyable; not thread-safe for writes.
class Config {
 public:
  explicit Config(const ConfigSchema& schema);

  // Defaults, then the file (if any), then each "key=value" override in order.
  static Config load(const ConfigSchema& schema, const std::optional<std::filesystem::path>& file,
                     std::span<const std::string> overrides = {});

  // Merges a TOML document; `origin` names it in errors (a file name).
  void merge_toml(std::string_view text, std::string_view origin);
  // Applies "key=value"; the value is parsed as the key's declared type.
  void apply_override(std::string_view assignment);
  // Sets a key from text, parsed as its declared type (free-form keys: bool, int, double, string).
  void set(std::string_view key, std::string_view text);
  void set_value(std::string_view key, Value value);

  [[nodiscard]] bool get_bool(std::string_view key) const;
  [[nodiscard]] std::int64_t get_int(std::string_view key) const;
  [[nodiscard]] double get_double(std::string_view key) const;
  [[nodiscard]] const std::string& get_string(std::string_view key) const;
  [[nodiscard]] ConfigSection section(std::string_view prefix) const;
  // True when the key was set by a file or an override rather than left at its default.
  [[nodiscard]] bool is_set(std::string_view key) const;

  // The effective configuration as TOML-style "key = value" lines; secrets shown as "<redacted>".
  [[nodiscard]] std::string dump() const;

 private:
  const Value& lookup(std::string_view key, ValueType type) const;
  void store(std::string_view key, Value value, std::string_view origin);

  std::shared_ptr<const ConfigSchema> schema_;  // a copy: the config never dangles
  std::map<std::string, Value, std::less<>> values_;
  std::map<std::string, bool, std::less<>> explicit_;
};

}  // namespace cohort

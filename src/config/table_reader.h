// Reading one TOML table against a fixed list of known keys, for
// ParseConfig. Internal to idem_config.
//
// Every problem (unknown key, wrong type, invalid value) is collected in a
// Diagnostics with its position rather than stopping at the first one, so a
// user fixes a config file in one pass.
#pragma once

#include <toml++/toml.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.h"

namespace idem::config_internal {

// One kind of table and the keys it accepts.
struct Section {
  std::string_view label;  // as the user writes it: "[defaults]", "[[tool]]"; "" for the top level
  std::vector<std::string_view> keys;
};

// A string in double quotes, for messages.
std::string Quote(std::string_view s);
// "a string", "an integer", ...: a TOML node's type in words.
std::string_view TypeName(const toml::node& node);

// Collects problems and reports them sorted by position in the file (toml++
// iterates tables in key order, not file order).
class Diagnostics {
 public:
  explicit Diagnostics(std::string_view source) : source_(source) {}

  void Add(const toml::source_region& where, std::string message) {
    entries_.push_back({where.begin.line, where.begin.column, std::move(message)});
  }
  bool empty() const { return entries_.empty(); }

  // Every problem, one per line: "<source>:<line>:<column>: <message>".
  std::string Join();

 private:
  struct Entry {
    toml::source_index line;
    toml::source_index column;
    std::string message;
  };
  std::string source_;
  std::vector<Entry> entries_;
};

// Reads one TOML table against its Section. Every typed getter returns
// nullopt both when the key is absent and when its value was wrong (after
// reporting it), so callers only assign what is valid.
class TableReader {
 public:
  // `schema` lists every section, for "it is a field of [[tool]]" hints.
  TableReader(const toml::table& table, const Section& section,
              std::span<const Section* const> schema, Diagnostics& diag)
      : table_(table), section_(section), schema_(schema), diag_(diag) {}

  const toml::table& table() const { return table_; }

  // Reports every key of the table that the section does not know.
  void CheckUnknown();

  // The node for `key` (which must be in the section), or nullptr.
  const toml::node* Find(std::string_view key) const { return table_.get(key); }

  void Error(const toml::node& at, std::string_view key, std::string_view problem);
  void ErrorAtTable(std::string_view problem) { diag_.Add(table_.source(), std::string(problem)); }

  std::optional<std::string> String(std::string_view key, bool allow_empty = true);

  std::optional<bool> Bool(std::string_view key);

  std::optional<int64_t> Integer(std::string_view key, int64_t min, int64_t max);

  // A float; an integer is accepted too (replay_ratio = 1).
  std::optional<double> Number(std::string_view key, double min, double max);

  std::optional<Duration> DurationValue(std::string_view key, bool allow_zero);

  // A size in bytes, at least 1.
  std::optional<size_t> Size(std::string_view key);

  // An array of strings (each non-empty).
  std::optional<std::vector<std::string>> StringArray(std::string_view key);

  // One of an enum's names (`name` of each value in `all`); the message
  // lists them all.
  template <typename E>
  std::optional<E> Enum(std::string_view key, std::string_view (*name)(E),
                        std::initializer_list<E> all) {
    std::vector<std::string_view> names;
    for (E e : all) names.push_back(name(e));
    std::optional<size_t> index = OneOf(key, names);
    if (!index) return std::nullopt;
    return *(all.begin() + *index);
  }

  // The index in `names` of the string at `key`; nullopt if absent or not
  // one of them (reported, with the list and a near miss).
  std::optional<size_t> OneOf(std::string_view key, const std::vector<std::string_view>& names);

  // A sub-table, or nullptr (absent or reported as the wrong type).
  const toml::table* Table(std::string_view key);

  // The tables of an array of tables ([[key]]); empty if absent or wrong.
  std::vector<const toml::table*> Tables(std::string_view key);

  // "'ttl' in [defaults]" or "'store'" at the top level.
  std::string Field(std::string_view key) const;

 private:
  std::nullopt_t WrongType(const toml::node& node, std::string_view key, std::string_view expected);

  // How the user writes a known key of this section: 'ttl', or [defaults] /
  // [[tool]] for the top level's tables.
  std::string Display(std::string_view key) const;

  std::string Where() const;

  std::string KnownList() const;

  // Other sections that have a field of this name ("[[tool]], [[route]]").
  std::string SectionsWith(std::string_view name) const;

  static std::string Trim(std::string number);

  const toml::table& table_;
  const Section& section_;
  std::span<const Section* const> schema_;
  Diagnostics& diag_;
};

}  // namespace idem::config_internal

#include "table_reader.h"

#include <algorithm>
#include <cctype>
#include <tuple>

#include "idem/config.h"

namespace idem::config_internal {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Levenshtein distance, case-insensitive (a key that differs only in case is
// distance 0: still a typo worth pointing at).
size_t EditDistance(std::string_view a_in, std::string_view b_in) {
  std::string a = Lower(a_in), b = Lower(b_in);
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The closest candidate within edit distance 2 (and closer than the word's
// own length, so "x" never suggests "ttl"), or empty.
std::string_view Suggest(std::string_view word, const std::vector<std::string_view>& candidates) {
  std::string_view best;
  size_t best_distance = 3;
  for (std::string_view c : candidates) {
    size_t d = EditDistance(word, c);
    if (d < best_distance && d < std::max<size_t>(word.size(), 1)) {
      best = c;
      best_distance = d;
    }
  }
  return best;
}

constexpr std::string_view kDurationExample =
    "a duration string such as \"24h\", \"30s\", \"500ms\" or \"1h30m\"";
constexpr std::string_view kSizeExample =
    "a size: an integer number of bytes or a string such as \"1MiB\", \"512KiB\" or \"1MB\"";

}  // namespace

std::string Quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += '?';
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string_view TypeName(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    default:
      return "nothing";
  }
}

std::string Diagnostics::Join() {
  std::stable_sort(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.line, a.column) < std::tie(b.line, b.column);
  });
  std::string out;
  for (const Entry& e : entries_) {
    if (!out.empty()) out += '\n';
    out += source_;
    if (e.line > 0) out += ":" + std::to_string(e.line) + ":" + std::to_string(e.column);
    out += ": " + e.message;
  }
  return out;
}

void TableReader::CheckUnknown() {
  for (auto&& [key, node] : table_) {
    std::string_view name = key.str();
    if (std::find(section_.keys.begin(), section_.keys.end(), name) != section_.keys.end()) {
      continue;
    }
    std::string message;
    if (section_.label.empty() && node.is_table()) {
      message = "unknown section [" + std::string(name) + "]";
    } else if (section_.label.empty() && node.is_array_of_tables()) {
      message = "unknown section [[" + std::string(name) + "]]";
    } else {
      message = "unknown field '" + std::string(name) + "'" + Where();
    }
    std::string_view suggestion = Suggest(name, section_.keys);
    if (!suggestion.empty()) {
      message += "; did you mean " + Display(suggestion) + "?";
    } else if (std::string elsewhere = SectionsWith(name); !elsewhere.empty()) {
      message += "; it is a field of " + elsewhere;
    } else {
      message += "; known fields: " + KnownList();
    }
    diag_.Add(key.source(), std::move(message));
  }
}

void TableReader::Error(const toml::node& at, std::string_view key, std::string_view problem) {
  diag_.Add(at.source(), Field(key) + " " + std::string(problem));
}

std::optional<std::string> TableReader::String(std::string_view key, bool allow_empty) {
  const toml::node* node = Find(key);
  if (node == nullptr) return std::nullopt;
  if (!node->is_string()) return WrongType(*node, key, "a string");
  std::string value = node->as_string()->get();
  if (!allow_empty && value.empty()) {
    Error(*node, key, "must not be empty");
    return std::nullopt;
  }
  return value;
}

std::optional<bool> TableReader::Bool(std::string_view key) {
  const toml::node* node = Find(key);
  if (node == nullptr) return std::nullopt;
  if (!node->is_boolean()) return WrongType(*node, key, "a boolean (true or false)");
  return node->as_boolean()->get();
}

std::optional<int64_t> TableReader::Integer(std::string_view key, int64_t min, int64_t max) {
  const toml::node* node = Find(key);
  if (node == nullptr) return std::nullopt;
  if (!node->is_integer()) return WrongType(*node, key, "an integer");
  int64_t value = node->as_integer()->get();
  if (value < min || value > max) {
    Error(*node, key,
          "must be between " + std::to_string(min) + " and " + std::to_string(max) + "; got " +
              std::to_string(value));
    return std::nullopt;
  }
  return value;
}

std::optional<double> TableReader::Number(std::string_view key, double min, double max) {
  const toml::node* node = Find(key);
  if (node == nullptr) return std::nullopt;
  double value = 0;
  if (node->is_floating_point()) {
    value = node->as_floating_point()->get();
  } else if (node->is_integer()) {
    value = static_cast<double>(node->as_integer()->get());
  } else {
    return WrongType(*node, key, "a number");
  }
  if (!(value >= min && value <= max)) {  // also rejects nan
    Error(*node, key,
          "must be between " + Trim(std::to_string(min)) + " and " + Trim(std::to_string(max)));
    return std::nullopt;
  }
  return value;
}

std::optional<Duration> TableReader::DurationValue(std::string_view key, bool allow_zero) {
  const toml::node* node = Find(key);
  if (node == nullptr) return std::nullopt;
  if (!node->is_string()) return WrongType(*node, key, kDurationExample);
  std::string_view text = node->as_string()->get();
  Result<Duration> d = ParseDuration(text);
  if (!d) {
    Error(*node, key, "is not valid: " + d.error().message);
    return std::nullopt;
  }
  if (!allow_zero && d->count() == 0) {
    Error(*node, key, "must be longer than zero; got " + Quote(text));
    return std::nullopt;
  }
  return *d;
}

std::optional<size_t> TableReader::Size(std::string_view key) {
  const toml::node* node = Find(key);
  if (node == nullptr) return std::nullopt;
  size_t bytes = 0;
  if (node->is_integer()) {
    int64_t v = node->as_integer()->get();
    if (v < 1) {
      Error(*node, key, "must be at least 1 byte; got " + std::to_string(v));
      return std::nullopt;
    }
    bytes = static_cast<size_t>(v);
  } else if (node->is_string()) {
    Result<size_t> parsed = ParseSize(node->as_string()->get());
    if (!parsed) {
      Error(*node, key, "is not valid: " + parsed.error().message);
      return std::nullopt;
    }
    bytes = *parsed;
    if (bytes < 1) {
      Error(*node, key, "must be at least 1 byte");
      return std::nullopt;
    }
  } else {
    return WrongType(*node, key, kSizeExample);
  }
  return bytes;
}

std::optional<std::vector<std::string>> TableReader::StringArray(std::string_view key) {
  const toml::node* node = Find(key);
  if (node == nullptr) return std::nullopt;
  if (!node->is_array()) return WrongType(*node, key, "an array of strings");
  std::vector<std::string> out;
  bool ok = true;
  for (const toml::node& element : *node->as_array()) {
    if (!element.is_string()) {
      Error(element, key,
            "must be an array of strings; element is " + std::string(TypeName(element)));
      ok = false;
      continue;
    }
    std::string value = element.as_string()->get();
    if (value.empty()) {
      Error(element, key, "must not contain an empty string");
      ok = false;
      continue;
    }
    out.push_back(std::move(value));
  }
  if (!ok) return std::nullopt;
  return out;
}

std::optional<size_t> TableReader::OneOf(std::string_view key,
                                         const std::vector<std::string_view>& names) {
  const toml::node* node = Find(key);
  if (node == nullptr) return std::nullopt;
  std::string listed;
  for (std::string_view n : names) {
    if (!listed.empty()) listed += ", ";
    listed += Quote(n);
  }
  if (!node->is_string()) return WrongType(*node, key, "one of " + listed);
  std::string_view text = node->as_string()->get();
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == text) return i;
  }
  std::string message = "must be one of " + listed + "; got " + Quote(text);
  if (std::string_view s = Suggest(text, names); !s.empty()) {
    message += " (did you mean " + Quote(s) + "?)";
  }
  Error(*node, key, message);
  return std::nullopt;
}

const toml::table* TableReader::Table(std::string_view key) {
  const toml::node* node = Find(key);
  if (node == nullptr) return nullptr;
  if (!node->is_table()) {
    WrongType(*node, key, "a table ([" + std::string(key) + "])");
    return nullptr;
  }
  return node->as_table();
}

std::vector<const toml::table*> TableReader::Tables(std::string_view key) {
  std::vector<const toml::table*> out;
  const toml::node* node = Find(key);
  if (node == nullptr) return out;
  std::string expected = "an array of tables ([[" + std::string(key) + "]])";
  if (!node->is_array()) {
    WrongType(*node, key, expected);
    return out;
  }
  for (const toml::node& element : *node->as_array()) {
    if (!element.is_table()) {
      Error(element, key, "must be " + expected + "; element is " + std::string(TypeName(element)));
      continue;
    }
    out.push_back(element.as_table());
  }
  return out;
}

std::string TableReader::Field(std::string_view key) const {
  std::string out = "'" + std::string(key) + "'";
  return out + Where();
}

std::nullopt_t TableReader::WrongType(const toml::node& node, std::string_view key,
                                      std::string_view expected) {
  Error(node, key, "must be " + std::string(expected) + "; got " + std::string(TypeName(node)));
  return std::nullopt;
}

std::string TableReader::Display(std::string_view key) const {
  if (section_.label.empty()) {
    if (key == "tool" || key == "route" || key == "tenant") return "[[" + std::string(key) + "]]";
    if (key != "store") return "[" + std::string(key) + "]";
  }
  return "'" + std::string(key) + "'";
}

std::string TableReader::Where() const {
  return section_.label.empty() ? std::string(" at the top level")
                                : " in " + std::string(section_.label);
}

std::string TableReader::KnownList() const {
  std::string out;
  for (std::string_view k : section_.keys) {
    if (!out.empty()) out += ", ";
    out += k;
  }
  return out;
}

std::string TableReader::SectionsWith(std::string_view name) const {
  std::string out;
  for (const Section* s : schema_) {
    if (s == &section_) continue;
    if (std::find(s->keys.begin(), s->keys.end(), name) == s->keys.end()) continue;
    if (!out.empty()) out += ", ";
    out += s->label.empty() ? "the top level" : std::string(s->label);
  }
  return out;
}

std::string TableReader::Trim(std::string number) {
  while (number.find('.') != std::string::npos && number.ends_with('0')) number.pop_back();
  if (number.ends_with('.')) number.pop_back();
  return number;
}

}  // namespace idem::config_internal

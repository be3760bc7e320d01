// Durations, sizes and globs as people write them in idemgate.toml and on
// the command line.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "table_reader.h"
#include "idem/config.h"

namespace idem {
namespace {

using config_internal::Quote;

constexpr std::string_view kDurationForms =
    "use digits followed by a unit (d, h, m, s or ms), largest unit first, e.g. \"24h\", "
    "\"30s\", \"500ms\", \"1h30m\", \"5m\", \"2d\"";

constexpr std::string_view kSizeForms =
    "use a whole number of bytes (\"1048576\") or digits followed by B, KB, MB, GB (powers of "
    "1000) or KiB, MiB, GiB (powers of 1024), e.g. \"512KiB\", \"1MiB\"";

struct DurationUnit {
  std::string_view name;
  int64_t millis;
};
// Largest first; "ms" before "m" so that the longer unit is tried first.
constexpr std::array<DurationUnit, 5> kDurationUnits = {{
    {"d", 86'400'000},
    {"h", 3'600'000},
    {"ms", 1},
    {"m", 60'000},
    {"s", 1'000},
}};
// Rank of a unit in largest-first order (ms is the smallest).
int UnitRank(std::string_view name) {
  if (name == "d") return 0;
  if (name == "h") return 1;
  if (name == "m") return 2;
  if (name == "s") return 3;
  return 4;  // ms
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Parses the leading run of digits at text[*pos]; false on overflow or none.
bool ParseDigits(std::string_view text, size_t* pos, uint64_t* value) {
  size_t start = *pos;
  uint64_t v = 0;
  while (*pos < text.size() && IsDigit(text[*pos])) {
    if (__builtin_mul_overflow(v, 10u, &v) ||
        __builtin_add_overflow(v, static_cast<uint64_t>(text[*pos] - '0'), &v)) {
      return false;
    }
    ++*pos;
  }
  *value = v;
  return *pos > start;
}

}  // namespace

Result<Duration> ParseDuration(std::string_view text) {
  auto invalid = [&] {
    return MakeError(ErrorCode::kInvalidArgument,
                     "invalid duration " + Quote(text) + ": " + std::string(kDurationForms));
  };
  if (text.empty()) return invalid();
  int64_t total = 0;
  int last_rank = -1;
  size_t pos = 0;
  while (pos < text.size()) {
    uint64_t value = 0;
    if (!ParseDigits(text, &pos, &value)) return invalid();
    const DurationUnit* unit = nullptr;
    for (const DurationUnit& u : kDurationUnits) {
      if (text.substr(pos).starts_with(u.name)) {
        unit = &u;
        break;
      }
    }
    if (unit == nullptr) return invalid();
    pos += unit->name.size();
    int rank = UnitRank(unit->name);
    if (rank <= last_rank) return invalid();  // "30m1h", "1h1h"
    last_rank = rank;
    int64_t part = 0;
    if (value > static_cast<uint64_t>(INT64_MAX) ||
        __builtin_mul_overflow(static_cast<int64_t>(value), unit->millis, &part) ||
        __builtin_add_overflow(total, part, &total)) {
      return MakeError(ErrorCode::kInvalidArgument, "duration " + Quote(text) + " is too long");
    }
  }
  return Duration(total);
}

std::string FormatDuration(Duration d) {
  int64_t ms = d.count();
  if (ms == 0) return "0s";
  std::string out;
  if (ms < 0) {
    out = "-";
    ms = -ms;
  }
  constexpr std::array<DurationUnit, 5> kLargestFirst = {{
      {"d", 86'400'000},
      {"h", 3'600'000},
      {"m", 60'000},
      {"s", 1'000},
      {"ms", 1},
  }};
  for (const DurationUnit& u : kLargestFirst) {
    if (ms >= u.millis) {
      out += std::to_string(ms / u.millis);
      out += u.name;
      ms %= u.millis;
    }
  }
  return out;
}

Result<size_t> ParseSize(std::string_view text) {
  auto invalid = [&] {
    return MakeError(ErrorCode::kInvalidArgument,
                     "invalid size " + Quote(text) + ": " + std::string(kSizeForms));
  };
  size_t pos = 0;
  uint64_t value = 0;
  if (!ParseDigits(text, &pos, &value)) return invalid();
  while (pos < text.size() && text[pos] == ' ') ++pos;
  std::string_view unit = text.substr(pos);
  uint64_t multiplier = 0;
  if (unit.empty() || unit == "B") {
    multiplier = 1;
  } else if (unit == "KB") {
    multiplier = 1000;
  } else if (unit == "MB") {
    multiplier = 1000 * 1000;
  } else if (unit == "GB") {
    multiplier = 1000 * 1000 * 1000;
  } else if (unit == "KiB") {
    multiplier = uint64_t{1} << 10;
  } else if (unit == "MiB") {
    multiplier = uint64_t{1} << 20;
  } else if (unit == "GiB") {
    multiplier = uint64_t{1} << 30;
  } else {
    return invalid();
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(value, multiplier, &bytes) || bytes > SIZE_MAX) {
    return MakeError(ErrorCode::kInvalidArgument, "size " + Quote(text) + " is too large");
  }
  return static_cast<size_t>(bytes);
}

bool GlobMatch(std::string_view pattern, std::string_view name) {
  // Iterative matcher with one backtrack point (the last '*'): linear in
  // practice and never recursive, so hostile patterns cannot blow the stack.
  size_t p = 0, n = 0;
  size_t star = std::string_view::npos, star_n = 0;
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      star_n = n;
    } else if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      n = ++star_n;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

}  // namespace idem

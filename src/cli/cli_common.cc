#include "cli_common.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "json/json_text.h"
#include "net/url_text.h"

namespace idem::cli {

void Say(std::string_view command, std::string_view message) {
  fmt::print(stderr, "idemgate {}: {}\n", command, message);
}

int Fail(std::string_view command, std::string_view message) {
  Say(command, message);
  return kExitFailure;
}

int Fail(std::string_view command, const Error& error) { return Fail(command, error.message); }

int UsageError(std::string_view command, std::string_view message) {
  fmt::print(stderr, "idemgate {}: {}\nRun with --help for more information.\n", command, message);
  return kExitUsage;
}

Result<Config> LoadConfigFor(const GlobalOptions& globals) {
  if (globals.config_path.empty()) return Config{};
  return LoadConfig(globals.config_path);
}

std::string StoreUrlFor(const GlobalOptions& globals, const Config& config) {
  if (!globals.store_url.empty()) return globals.store_url;
  if (!config.store.empty()) return config.store;
  return DefaultStoreUrl();
}

StoreClock& StoreTime() {
  static StoreClock clock(SystemClock::Default());
  return clock;
}

Result<std::unique_ptr<Store>> OpenStoreFor(const GlobalOptions& globals, const Config& config,
                                            const StoreOptions& options) {
  std::string url = StoreUrlFor(globals, config);
  Result<std::unique_ptr<Store>> store = OpenStore(url, StoreTime(), options);
  if (!store) {
    return MakeError(store.error().code, "cannot open store " + net::WithoutPassword(url) + ": " +
                                             store.error().message);
  }
  // Leases are judged by the store's clock. Until one read of it succeeds
  // the offset is a guess (zero), and a host whose clock runs ahead would
  // take over calls still running elsewhere: refuse rather than guess.
  Result<Duration> synced = StoreTime().SyncFirst(**store, kFirstClockSyncAttempts,
                                                  kFirstClockSyncPause);
  if (!synced) {
    return MakeError(synced.error().code,
                     "cannot read the clock of store " + net::WithoutPassword(url) + " (" +
                         synced.error().message + ", " +
                         std::to_string(kFirstClockSyncAttempts) +
                         " tries): idemgate judges leases by the store's clock and does not "
                         "start without it; check that the store answers (Redis: TIME on the "
                         "node of the audit stream, a Redis Cluster with a master for every "
                         "slot; PostgreSQL: SELECT clock_timestamp()), then start again");
  }
  return store;
}

Result<StoreSession> OpenSession(const GlobalOptions& globals) {
  StoreSession session;
  Result<Config> config = LoadConfigFor(globals);
  if (!config) return std::unexpected(config.error());
  session.config = std::move(*config);
  Result<std::unique_ptr<Store>> store = OpenStoreFor(globals, session.config);
  if (!store) return std::unexpected(store.error());
  session.store = std::move(*store);
  return session;
}

namespace {

Result<std::string> ReadFd(int fd, size_t limit, std::string_view what) {
  std::string out;
  char buf[1 << 16];
  while (out.size() < limit) {
    size_t want = std::min(sizeof buf, limit - out.size());
    ssize_t n = ::read(fd, buf, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return MakeError(ErrorCode::kUnavailable,
                       "cannot read " + std::string(what) + ": " + std::strerror(errno));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

}  // namespace

Result<std::string> ReadStdin(size_t limit) { return ReadFd(STDIN_FILENO, limit, "stdin"); }

Result<std::string> ReadFileBytes(const std::string& path, size_t limit) {
  if (path == "-") return ReadStdin(limit);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return MakeError(errno == ENOENT ? ErrorCode::kNotFound : ErrorCode::kUnavailable,
                     "cannot open " + path + ": " + std::strerror(errno));
  }
  Result<std::string> bytes = ReadFd(fd, limit, path);
  ::close(fd);
  return bytes;
}

Result<void> WriteStdout(std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::write(STDOUT_FILENO, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return MakeError(ErrorCode::kUnavailable,
                       std::string("cannot write to stdout: ") + std::strerror(errno));
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return {};
}

bool StdoutIsTerminal() { return ::isatty(STDOUT_FILENO) == 1; }
bool StdinIsTerminal() { return ::isatty(STDIN_FILENO) == 1; }
bool StderrIsTerminal() { return ::isatty(STDERR_FILENO) == 1; }

std::string FormatTime(TimePoint t) { return ToUnixMillis(t) == 0 ? "-" : FormatIsoTime(t); }

namespace {

// Reads exactly `n` digits at text[*pos].
bool Digits(std::string_view text, size_t* pos, size_t n, int* out) {
  if (*pos + n > text.size()) return false;
  int v = 0;
  for (size_t i = 0; i < n; ++i) {
    char c = text[*pos + i];
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *pos += n;
  *out = v;
  return true;
}

bool Expect(std::string_view text, size_t* pos, char c) {
  if (*pos < text.size() && text[*pos] == c) {
    ++*pos;
    return true;
  }
  return false;
}

std::optional<TimePoint> ParseIso8601(std::string_view text) {
  size_t pos = 0;
  std::tm tm{};
  int year, month, day;
  if (!Digits(text, &pos, 4, &year) || !Expect(text, &pos, '-') || !Digits(text, &pos, 2, &month) ||
      !Expect(text, &pos, '-') || !Digits(text, &pos, 2, &day)) {
    return std::nullopt;
  }
  int hour = 0, minute = 0, second = 0, millis = 0, offset_minutes = 0;
  if (pos < text.size() && (text[pos] == 'T' || text[pos] == 't' || text[pos] == ' ')) {
    ++pos;
    if (!Digits(text, &pos, 2, &hour) || !Expect(text, &pos, ':') ||
        !Digits(text, &pos, 2, &minute)) {
      return std::nullopt;
    }
    if (Expect(text, &pos, ':')) {
      if (!Digits(text, &pos, 2, &second)) return std::nullopt;
      if (Expect(text, &pos, '.')) {
        int scale = 100;
        size_t start = pos;
        while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
          millis += (text[pos] - '0') * scale;
          scale /= 10;
          ++pos;
        }
        if (pos == start) return std::nullopt;
      }
    }
    if (pos < text.size() && (text[pos] == 'Z' || text[pos] == 'z')) {
      ++pos;
    } else if (pos < text.size() && (text[pos] == '+' || text[pos] == '-')) {
      int sign = text[pos] == '+' ? 1 : -1;
      ++pos;
      int oh, om;
      if (!Digits(text, &pos, 2, &oh)) return std::nullopt;
      Expect(text, &pos, ':');
      if (!Digits(text, &pos, 2, &om)) return std::nullopt;
      offset_minutes = sign * (oh * 60 + om);
    }
  }
  if (pos != text.size()) return std::nullopt;
  if (month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 || minute > 59 || second > 60) {
    return std::nullopt;
  }
  tm.tm_year = year - 1900;
  tm.tm_mon = month - 1;
  tm.tm_mday = day;
  tm.tm_hour = hour;
  tm.tm_min = minute;
  tm.tm_sec = second;
  std::time_t t = ::timegm(&tm);
  int64_t ms = (static_cast<int64_t>(t) - int64_t{offset_minutes} * 60) * 1000 + millis;
  return FromUnixMillis(ms);
}

}  // namespace

Result<TimePoint> ParseSince(std::string_view text, TimePoint now) {
  if (Result<Duration> d = ParseDuration(text)) return now - *d;
  if (std::optional<TimePoint> t = ParseIso8601(text)) return *t;
  return MakeError(ErrorCode::kInvalidArgument,
                   "--since \"" + std::string(text) +
                       "\" is neither a duration (\"30m\", \"1h\", \"2d\") nor an ISO-8601 time "
                       "(\"2026-01-01\", \"2026-01-01T10:00:00Z\")");
}

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

void JsonObject::Name(std::string_view name) {
  if (out_.size() > 1) out_ += ',';
  json_text::AppendQuoted(out_, name);
  out_ += ':';
}

JsonObject& JsonObject::Add(std::string_view name, std::string_view value) {
  Name(name);
  json_text::AppendQuoted(out_, value);
  return *this;
}

JsonObject& JsonObject::Add(std::string_view name, int64_t value) {
  Name(name);
  out_ += std::to_string(value);
  return *this;
}

JsonObject& JsonObject::Add(std::string_view name, uint64_t value) {
  Name(name);
  out_ += std::to_string(value);
  return *this;
}

JsonObject& JsonObject::Add(std::string_view name, double value) {
  Name(name);
  out_ += fmt::format("{}", value);
  return *this;
}

JsonObject& JsonObject::Add(std::string_view name, bool value) {
  Name(name);
  out_ += value ? "true" : "false";
  return *this;
}

JsonObject& JsonObject::AddNull(std::string_view name) {
  Name(name);
  out_ += "null";
  return *this;
}

std::string ForTerminal(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  auto escape = [&](unsigned char c) {
    out.append("\\x").push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f) {
      escape(c);
    } else if (c == 0xc2 && i + 1 < text.size() &&
               static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(text[i + 1]) <= 0x9f) {
      escape(c);
      escape(static_cast<unsigned char>(text[++i]));
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

std::string Table::str() const {
  std::vector<size_t> widths(header_.size(), 0);
  auto measure = [&](const std::vector<std::string>& row) {
    for (size_t i = 0; i < row.size() && i < widths.size(); ++i) {
      widths[i] = std::max(widths[i], row[i].size());
    }
  };
  measure(header_);
  for (const auto& row : rows_) measure(row);
  std::string out;
  auto print = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t i = 0; i < row.size() && i < widths.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line.append(widths[i] - row[i].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  };
  print(header_);
  for (const auto& row : rows_) print(row);
  return out;
}

}  // namespace idem::cli

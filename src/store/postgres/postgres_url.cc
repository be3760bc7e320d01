#include "postgres_url.h"

#include <fmt/format.h>
#include <libpq-fe.h>

#include <algorithm>
#include <charconv>
#include <memory>

namespace idem::postgres {
namespace {

// Defaults for libpq keywords the URL does not set. Without them a
// black-holed server would hold a connect for libpq's unbounded default and
// a request for the kernel's 15-minute retransmission limit; with them a dead
// server is noticed within seconds and the store answers kUnavailable.
constexpr std::pair<const char*, const char*> kDefaults[] = {
    {"connect_timeout", "5"},      {"application_name", "idemgate"}, {"keepalives", "1"},
    {"keepalives_idle", "30"},     {"keepalives_interval", "10"},    {"keepalives_count", "3"},
    {"tcp_user_timeout", "30000"},
};

constexpr size_t kMaxPoolSize = 256;
constexpr size_t kMaxBatchSize = 1024;
constexpr size_t kMaxIdentifierBytes = 63;  // PostgreSQL's NAMEDATALEN - 1

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Result<std::string> PercentDecode(std::string_view in, std::string_view name) {
  std::string out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out += in[i];
      continue;
    }
    const int hi = i + 2 < in.size() ? HexValue(in[i + 1]) : -1;
    const int lo = hi >= 0 ? HexValue(in[i + 2]) : -1;
    if (lo < 0) {
      return MakeError(ErrorCode::kInvalidArgument,
                       fmt::format("postgres store URL: parameter \"{}\" has a malformed "
                                   "percent-escape",
                                   name));
    }
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

struct Split {
  std::string libpq_url;  // the URL without idemgate's own parameters
  std::string schema = "public";
  size_t pool_size = 16;
  size_t batch_size = 16;
  size_t batch_writers = 2;
  bool read_before_claim = false;
};

// `raw` as a number from 1 to `max`, or kInvalidArgument naming `name`.
Result<size_t> ParseCount(std::string_view name, std::string_view raw, size_t max) {
  size_t n = 0;
  auto [end, ec] = std::from_chars(raw.data(), raw.data() + raw.size(), n);
  if (ec != std::errc() || end != raw.data() + raw.size() || n == 0 || n > max) {
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("postgres store URL: {} \"{}\" is not a number from 1 to {}",
                                 name, raw, max));
  }
  return n;
}

// Takes idemgate's parameters out of the query string; libpq refuses
// parameters it does not know.
Result<Split> TakeOwnParameters(std::string_view url) {
  Split split;
  const size_t q = url.find('?');
  split.libpq_url = std::string(url.substr(0, q));
  if (q == std::string_view::npos) return split;

  std::string kept;
  std::string_view query = url.substr(q + 1);
  while (!query.empty()) {
    const size_t amp = query.find('&');
    std::string_view item = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    const size_t eq = item.find('=');
    const std::string_view name = item.substr(0, eq);
    const std::string_view raw = eq == std::string_view::npos ? "" : item.substr(eq + 1);
    if (name == "schema") {
      auto value = PercentDecode(raw, name);
      if (!value) return std::unexpected(std::move(value.error()));
      if (value->empty() || value->size() > kMaxIdentifierBytes ||
          value->find('\0') != std::string::npos) {
        return MakeError(ErrorCode::kInvalidArgument,
                         fmt::format("postgres store URL: schema \"{}\" must be 1 to {} bytes "
                                     "with no NUL",
                                     *value, kMaxIdentifierBytes));
      }
      split.schema = std::move(*value);
    } else if (name == "pool_size" || name == "batch_size" || name == "batch_writers") {
      const bool pool = name == "pool_size";
      auto n = ParseCount(name, raw, pool ? kMaxPoolSize : kMaxBatchSize);
      if (!n) return std::unexpected(std::move(n.error()));
      (pool ? split.pool_size : name == "batch_size" ? split.batch_size : split.batch_writers) = *n;
    } else if (name == "read_before_claim") {
      if (raw != "on" && raw != "off") {
        return MakeError(ErrorCode::kInvalidArgument,
                         fmt::format("postgres store URL: read_before_claim \"{}\" must be on "
                                     "or off",
                                     raw));
      }
      split.read_before_claim = raw == "on";
    } else if (!item.empty()) {
      kept += kept.empty() ? "?" : "&";
      kept += item;
    }
  }
  split.libpq_url += kept;
  // Each writer holds a pooled connection while it runs a batch.
  split.batch_writers = std::min(split.batch_writers, split.pool_size);
  return split;
}

// libpq's parse errors sometimes quote the whole URL, password included.
std::string WithoutUrl(std::string why) {
  while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
  if (why.find("://") != std::string::npos) return "libpq cannot parse it";
  return why;
}

struct ConninfoFree {
  void operator()(PQconninfoOption* o) const { PQconninfoFree(o); }
};

}  // namespace

Result<PostgresUrl> ParsePostgresUrl(std::string_view url) {
  auto split = TakeOwnParameters(url);
  if (!split) return std::unexpected(std::move(split.error()));

  char* raw_error = nullptr;
  std::unique_ptr<PQconninfoOption, ConninfoFree> options(
      PQconninfoParse(split->libpq_url.c_str(), &raw_error));
  if (!options) {
    std::string why = raw_error ? raw_error : "out of memory";
    if (raw_error) PQfreemem(raw_error);
    return MakeError(ErrorCode::kInvalidArgument,
                     fmt::format("postgres store URL is malformed: {}; write "
                                 "postgres://USER@HOST:PORT/DBNAME?schema=NAME",
                                 WithoutUrl(why)));
  }

  PostgresUrl parsed;
  parsed.schema = std::move(split->schema);
  parsed.pool_size = split->pool_size;
  parsed.batch_size = split->batch_size;
  parsed.batch_writers = split->batch_writers;
  parsed.read_before_claim = split->read_before_claim;
  std::string host, port, dbname;
  for (const PQconninfoOption* o = options.get(); o->keyword; ++o) {
    if (!o->val) continue;
    std::string_view keyword(o->keyword);
    if (keyword == "host" || (keyword == "hostaddr" && host.empty())) host = o->val;
    if (keyword == "port") port = o->val;
    if (keyword == "dbname") dbname = o->val;
    parsed.conninfo.emplace_back(o->keyword, o->val);
  }
  for (const auto& [keyword, value] : kDefaults) {
    bool set = false;
    for (const auto& kv : parsed.conninfo) set = set || kv.first == keyword;
    if (!set) parsed.conninfo.emplace_back(keyword, value);
  }
  parsed.where = fmt::format("{}:{}/{} schema {}", host.empty() ? "(default socket)" : host,
                             port.empty() ? "5432" : port, dbname, parsed.schema);
  return parsed;
}

}  // namespace idem::postgres

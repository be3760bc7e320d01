#include "redis_url.h"

#include <charconv>

#include "idem/config.h"
#include "net/url_text.h"

namespace idem::redis {
namespace {

constexpr std::string_view kForms =
    "write redis://[[user]:password@]host[:port][/db][?options] or "
    "redis+cluster://host:port,host:port,…[?options] (rediss:// and rediss+cluster:// for TLS); "
    "options: connect_timeout, timeout, prefix, pool, attempts_maxlen, attempts_scan, "
    "wait_replicas, "
    "wait_timeout, fence_floor_keep, body_field_bytes, tls_ca, tls_cert, tls_key, "
    "tls_server_name, tls_verify";

// More than any hash-max-listpack-value worth setting.
constexpr size_t kMaxBodyFieldBytes = 1 << 20;

Error Invalid(std::string_view url, std::string_view why) {
  return Error{ErrorCode::kInvalidArgument,
               "invalid redis store URL \"" + net::WithoutPassword(url) +
                   "\": " + std::string(why) + "; " + std::string(kForms)};
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Decodes %XX escapes; false on a malformed escape.
bool PercentDecode(std::string_view in, std::string* out) {
  out->clear();
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      *out += in[i];
      continue;
    }
    if (i + 2 >= in.size()) return false;
    int hi = HexValue(in[i + 1]), lo = HexValue(in[i + 2]);
    if (hi < 0 || lo < 0) return false;
    *out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return true;
}

template <typename T>
bool ParseNumber(std::string_view s, T* out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

Result<NodeAddress> ParseHostPort(std::string_view url, std::string_view hp) {
  NodeAddress a;
  std::string_view port;
  if (hp.starts_with('[')) {  // [v6]:port
    size_t close = hp.find(']');
    if (close == std::string_view::npos) return std::unexpected(Invalid(url, "unclosed '['"));
    a.host = std::string(hp.substr(1, close - 1));
    std::string_view rest = hp.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') return std::unexpected(Invalid(url, "junk after ']'"));
      port = rest.substr(1);
      if (port.empty()) return std::unexpected(Invalid(url, "empty port"));
    }
  } else {
    size_t colon = hp.rfind(':');
    if (colon != std::string_view::npos) {
      a.host = std::string(hp.substr(0, colon));
      port = hp.substr(colon + 1);
      if (port.empty()) return std::unexpected(Invalid(url, "empty port"));
    } else {
      a.host = std::string(hp);
    }
  }
  if (a.host.empty()) return std::unexpected(Invalid(url, "no host"));
  if (!port.empty() && (!ParseNumber(port, &a.port) || a.port <= 0 || a.port > 65535)) {
    return std::unexpected(Invalid(url, "bad port \"" + std::string(port) + "\""));
  }
  return a;
}

Result<void> ApplyOption(std::string_view url, std::string_view name, const std::string& value,
                         RedisConfig& cfg) {
  auto duration = [&](Duration* out) -> Result<void> {
    auto d = ParseDuration(value);
    if (!d) return std::unexpected(Invalid(url, std::string(name) + ": " + d.error().message));
    *out = *d;
    return {};
  };
  auto count = [&](auto* out) -> Result<void> {
    if (!ParseNumber(value, out)) {
      return std::unexpected(Invalid(url, std::string(name) + " must be a whole number"));
    }
    return {};
  };
  auto text = [&](std::string* out) -> Result<void> {
    if (value.empty()) return std::unexpected(Invalid(url, std::string(name) + " is empty"));
    *out = value;
    return {};
  };
  if (name == "connect_timeout") return duration(&cfg.connect_timeout);
  if (name == "timeout") return duration(&cfg.command_timeout);
  if (name == "wait_timeout") return duration(&cfg.wait_timeout);
  if (name == "fence_floor_keep") return duration(&cfg.fence_floor_keep);
  if (name == "pool") return count(&cfg.pool);
  if (name == "attempts_maxlen") return count(&cfg.attempts_maxlen);
  if (name == "attempts_scan") return count(&cfg.attempts_scan);
  if (name == "body_field_bytes") {
    if (auto ok = count(&cfg.body_field_bytes); !ok) return ok;
    if (cfg.body_field_bytes > kMaxBodyFieldBytes) {
      return std::unexpected(
          Invalid(url, "body_field_bytes must be at most " + std::to_string(kMaxBodyFieldBytes)));
    }
    return {};
  }
  if (name == "wait_replicas") return count(&cfg.wait_replicas);
  if (name.starts_with("tls_") && !cfg.tls.enabled) {
    return std::unexpected(Invalid(url, std::string(name) + " needs TLS: write rediss://"));
  }
  if (name == "tls_ca") return text(&cfg.tls.ca_file);
  if (name == "tls_cert") return text(&cfg.tls.cert_file);
  if (name == "tls_key") return text(&cfg.tls.key_file);
  if (name == "tls_server_name") return text(&cfg.tls.server_name);
  if (name == "tls_verify") {
    if (value != "true" && value != "false") {
      return std::unexpected(Invalid(url, "tls_verify must be true or false"));
    }
    cfg.tls.verify = value == "true";
    return {};
  }
  if (name == "prefix") {
    if (value.find_first_of("{}") != std::string::npos) {
      return std::unexpected(
          Invalid(url, "prefix must not contain '{' or '}' (they would break the hash tag)"));
    }
    cfg.prefix = value;
    return {};
  }
  return std::unexpected(Invalid(url, "unknown option \"" + std::string(name) + "\""));
}

}  // namespace

std::string NodeAddress::ToString() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

bool IsRedisUrl(std::string_view url) {
  for (std::string_view s : {"redis://", "rediss://", "redis+cluster://", "rediss+cluster://"}) {
    if (url.starts_with(s)) return true;
  }
  return false;
}

Result<RedisConfig> ParseRedisUrl(std::string_view url) {
  RedisConfig cfg;
  std::string_view rest;
  if (url.starts_with("redis://")) {
    rest = url.substr(8);
  } else if (url.starts_with("redis+cluster://")) {
    rest = url.substr(16);
    cfg.cluster = true;
  } else if (url.starts_with("rediss://")) {
    rest = url.substr(9);
    cfg.tls.enabled = true;
  } else if (url.starts_with("rediss+cluster://")) {
    rest = url.substr(17);
    cfg.cluster = true;
    cfg.tls.enabled = true;
  } else {
    return std::unexpected(Invalid(
        url, "the scheme must be redis://, redis+cluster://, rediss:// or rediss+cluster://"));
  }

  std::string_view query;
  if (size_t q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  std::string_view path;
  if (size_t slash = rest.find('/'); slash != std::string_view::npos) {
    path = rest.substr(slash + 1);
    rest = rest.substr(0, slash);
  }
  if (size_t at = rest.rfind('@'); at != std::string_view::npos) {
    std::string_view userinfo = rest.substr(0, at);
    rest = rest.substr(at + 1);
    std::string_view user = userinfo, password;
    if (size_t colon = userinfo.find(':'); colon != std::string_view::npos) {
      user = userinfo.substr(0, colon);
      password = userinfo.substr(colon + 1);
    } else {
      // "redis://secret@host" is the common shorthand for a password alone.
      user = {};
      password = userinfo;
    }
    if (!PercentDecode(user, &cfg.user) || !PercentDecode(password, &cfg.password)) {
      return std::unexpected(Invalid(url, "bad %-escape in the user or password"));
    }
  }
  if (rest.empty()) return std::unexpected(Invalid(url, "no host"));
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view hp = rest.substr(0, comma);
    auto node = ParseHostPort(url, hp);
    if (!node) return std::unexpected(node.error());
    cfg.nodes.push_back(std::move(*node));
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
    if (rest.empty()) return std::unexpected(Invalid(url, "trailing ','"));
  }
  if (!cfg.cluster && cfg.nodes.size() > 1) {
    return std::unexpected(Invalid(url, "several hosts need redis+cluster://"));
  }
  if (!path.empty()) {
    if (!ParseNumber(path, &cfg.db) || cfg.db < 0) {
      return std::unexpected(Invalid(url, "the path must be a database number"));
    }
    if (cfg.cluster && cfg.db != 0) {
      return std::unexpected(Invalid(url, "Redis Cluster has only database 0"));
    }
  }
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (pair.empty()) continue;
    size_t eq = pair.find('=');
    if (eq == std::string_view::npos) {
      return std::unexpected(Invalid(url, "option \"" + std::string(pair) + "\" has no value"));
    }
    std::string value;
    if (!PercentDecode(pair.substr(eq + 1), &value)) {
      return std::unexpected(Invalid(url, "bad %-escape in an option"));
    }
    if (auto r = ApplyOption(url, pair.substr(0, eq), value, cfg); !r) {
      return std::unexpected(r.error());
    }
  }
  if (cfg.tls.cert_file.empty() != cfg.tls.key_file.empty()) {
    return std::unexpected(Invalid(url, "tls_cert and tls_key go together: give both or neither"));
  }
  if (cfg.pool == 0) return std::unexpected(Invalid(url, "pool must be at least 1"));
  if (cfg.command_timeout.count() <= 0 || cfg.connect_timeout.count() <= 0) {
    return std::unexpected(Invalid(url, "timeouts must be positive"));
  }
  if (cfg.wait_replicas > 0 && cfg.wait_timeout >= cfg.command_timeout) {
    return std::unexpected(
        Invalid(url, "wait_timeout must be shorter than timeout (WAIT blocks the command)"));
  }
  return cfg;
}

}  // namespace idem::redis

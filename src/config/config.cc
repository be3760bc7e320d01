// Config lookups (rule resolution) and loading the file from disk.
// The TOML schema itself is in parse_config.cc.
#include "idem/config.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>

#include "idem/canonical_json.h"  // Sha256Hex

namespace idem {
namespace {

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'a' && x <= 'z') x = static_cast<char>(x - 'a' + 'A');
    if (y >= 'a' && y <= 'z') y = static_cast<char>(y - 'a' + 'A');
    if (x != y) return false;
  }
  return true;
}

bool IsGlob(std::string_view pattern) {
  return pattern.find_first_of("*?") != std::string_view::npos;
}

// A route's `match`: a glob over the whole path, or a path prefix that ends
// at a segment boundary.
bool RouteMatches(std::string_view match, std::string_view path) {
  if (IsGlob(match)) return GlobMatch(match, path);
  if (!path.starts_with(match)) return false;
  return path.size() == match.size() || match.ends_with('/') || path[match.size()] == '/';
}

// Compares the SHA-256 digests of two secrets (hex, always 64 bytes) without
// an early exit, so the time taken tells an attacker neither how many
// leading bytes of a token were right nor how long the token is: comparing
// the secrets themselves returned at once on a length mismatch (security
// review F14).
bool DigestsEqual(std::string_view a_digest, std::string_view b_digest) {
  unsigned char diff = a_digest.size() == b_digest.size() ? 0 : 1;
  const size_t n = std::min(a_digest.size(), b_digest.size());
  for (size_t i = 0; i < n; ++i) {
    diff |= static_cast<unsigned char>(a_digest[i] ^ b_digest[i]);
  }
  return diff == 0;
}

}  // namespace

Policy PolicyOverrides::ApplyTo(Policy base) const {
  if (ttl) base.ttl = *ttl;
  if (lease) base.lease = *lease;
  if (wait) base.wait = *wait;
  if (window) base.window = *window;
  if (on_unknown) base.on_unknown = *on_unknown;
  if (errors) base.errors = *errors;
  if (on_drift) base.on_drift = *on_drift;
  if (on_store_down) base.on_store_down = *on_store_down;
  if (max_result_bytes) base.max_result_bytes = *max_result_bytes;
  if (observe) base.observe = *observe;
  return base;
}

const ToolRule* Config::RuleFor(std::string_view tool) const {
  for (const ToolRule& rule : tools) {
    if (GlobMatch(rule.match, tool)) return &rule;
  }
  return nullptr;
}

Policy Config::PolicyFor(std::string_view tool) const {
  const ToolRule* rule = RuleFor(tool);
  return rule ? rule->overrides.ApplyTo(defaults) : defaults;
}

KeyMode Config::ModeFor(std::string_view tool, bool mutating) const {
  const ToolRule* rule = RuleFor(tool);
  if (rule && rule->mode) return *rule->mode;
  bool gated = (rule && rule->gated) ? *rule->gated : mutating;
  return gated ? KeyMode::kTurn : KeyMode::kOff;
}

const RouteRule* Config::RouteFor(std::string_view method, std::string_view path) const {
  path = path.substr(0, path.find('?'));
  for (const RouteRule& rule : routes) {
    if (!RouteMatches(rule.match, path)) continue;
    for (const std::string& m : rule.methods) {
      if (EqualsIgnoreCase(m, method)) return &rule;
    }
  }
  return nullptr;
}

Policy Config::PolicyForRoute(std::string_view method, std::string_view path) const {
  const RouteRule* rule = RouteFor(method, path);
  return rule ? rule->overrides.ApplyTo(defaults) : defaults;
}

const Tenant* Config::TenantForToken(std::string_view token) const {
  const Tenant* found = nullptr;
  const std::string digest = Sha256Hex(token);
  // No early return: every token is compared, whichever one matches.
  for (const Tenant& tenant : tenants) {
    for (const std::string& t : tenant.tokens) {
      if (DigestsEqual(Sha256Hex(t), digest) && found == nullptr) found = &tenant;
    }
  }
  return found;
}

Result<Config> LoadConfig(const std::string& path) {
  auto unreadable = [&](int err) {
    return MakeError(ErrorCode::kUnavailable,
                     "cannot read config file " + path + ": " + std::strerror(err));
  };
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) {
      return MakeError(ErrorCode::kNotFound,
                       "config file " + path + " does not exist; check the --config path");
    }
    return unreadable(err);
  }
  std::string text;
  char buf[1 << 14];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return unreadable(err);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return ParseConfig(text, path);
}

Result<IdSource> ParseIdSource(std::string_view text) {
  auto refuse = [text](std::string_view why) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "id source \"" + std::string(text.substr(0, 120)) + "\" " +
                         std::string(why) +
                         "; write \"meta:NAME\", \"meta:NAME#/json/pointer\", \"env:VAR\", "
                         "\"header:NAME\" or \"hook:turn\"");
  };
  IdSource source;
  source.text = std::string(text);
  std::string_view rest;
  if (text.starts_with("meta:")) {
    rest = text.substr(5);
    if (const size_t hash = rest.find('#'); hash != std::string_view::npos) {
      source.pointer = std::string(rest.substr(hash + 1));
      rest = rest.substr(0, hash);
      if (!source.pointer.starts_with('/')) return refuse("has a pointer that does not start with '/'");
    }
  } else if (text.starts_with("env:")) {
    source.kind = IdSource::Kind::kEnv;
    rest = text.substr(4);
  } else if (text.starts_with("header:")) {
    source.kind = IdSource::Kind::kHeader;
    rest = text.substr(7);
    const bool token = std::all_of(rest.begin(), rest.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) ||
             std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
    });
    if (!token) return refuse("names no HTTP header (letters, digits and !#$%&'*+-.^_`|~)");
  } else if (text.starts_with("hook:")) {
    source.kind = IdSource::Kind::kHook;
    rest = text.substr(5);
    if (rest != "turn") {
      return refuse("names no value the prompt hook records (the only one is \"hook:turn\")");
    }
  } else {
    return refuse("names no kind of source");
  }
  if (rest.empty()) return refuse("names nothing");
  source.name = std::string(rest);
  return source;
}

}  // namespace idem

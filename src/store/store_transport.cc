#include "store_transport.h"

#include "net/http_rules.h"
#include "net/url_text.h"
#include "postgres_url.h"
#include "redis_url.h"

namespace idem {
namespace {

// A libpq host list entry: "" and "/path" (a Unix socket) stay on this machine.
bool IsLocalPostgresHost(std::string_view host) {
  return host.empty() || host.starts_with('/') || host.starts_with('@') ||
         net::IsLoopbackHost(host);
}

}  // namespace

std::optional<std::string> UnverifiedStoreTransport(std::string_view url) {
  if (redis::IsRedisUrl(url)) {
    Result<redis::RedisConfig> config = redis::ParseRedisUrl(url);
    if (!config) return std::nullopt;
    bool remote = false;
    for (const redis::NodeAddress& node : config->nodes) remote |= !net::IsLoopbackHost(node.host);
    if (!remote) return std::nullopt;
    if (!config->tls.enabled) {
      return "warning: the store " + net::WithoutPassword(url) +
             " is reached over the network in plain text: records, outcomes and the password "
             "can be read and changed on the way; use rediss:// (verified TLS)";
    }
    if (!config->tls.verify) {
      return "warning: the store " + net::WithoutPassword(url) +
             " is reached with tls_verify=false: anyone on the way can pose as the server; "
             "remove tls_verify=false (give tls_ca=PATH for a private CA)";
    }
    return std::nullopt;
  }
  if (url.starts_with("postgres://") || url.starts_with("postgresql://")) {
    Result<postgres::PostgresUrl> config = postgres::ParsePostgresUrl(url);
    if (!config) return std::nullopt;
    std::string hosts;
    std::string sslmode = "prefer";  // libpq's default
    for (const auto& [name, value] : config->conninfo) {
      if (name == "host" || name == "hostaddr") hosts += value + ",";
      if (name == "sslmode") sslmode = value;
    }
    bool remote = false;
    size_t start = 0;
    while (start < hosts.size()) {
      size_t end = hosts.find(',', start);
      remote |= !IsLocalPostgresHost(std::string_view(hosts).substr(start, end - start));
      start = end + 1;
    }
    if (!remote || sslmode == "verify-full") return std::nullopt;
    return "warning: the store " + config->where + " is reached over the network with sslmode=" +
           sslmode + ", which does not verify the server: add sslmode=verify-full (and "
           "sslrootcert=PATH for a private CA) to the store URL";
  }
  return std::nullopt;
}

}  // namespace idem

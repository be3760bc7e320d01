// Redis store URLs (docs/DESIGN.md §5): what to connect to and how. Parsing does no
// I/O.
//
//   redis://[[user]:password@]host[:port][/db][?option=value&…]
//   redis+cluster://[[user]:password@]host[:port],host[:port],…[?option=value&…]
//   rediss://…, rediss+cluster://…  the same over TLS (tls_* options)
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.h"
#include "idem/error.h"

namespace idem::redis {

struct NodeAddress {
  std::string host;
  int port = 6379;
  bool operator==(const NodeAddress&) const = default;
  auto operator<=>(const NodeAddress&) const = default;
  // "host:port", or "[v6]:port".
  std::string ToString() const;
};

// TLS (rediss://, rediss+cluster://): the server's certificate is verified
// against the system trust store and `ca_file`, and must carry
// `server_name` (default: the host connected to; in a cluster, each node's).
struct TlsOptions {
  bool enabled = false;
  // PEM CA certificates trusted besides the system store. Query: tls_ca=PATH
  std::string ca_file;
  // PEM client certificate and its key, for a server that asks for one
  // (Redis does by default: tls-auth-clients yes). Query: tls_cert=, tls_key=
  std::string cert_file;
  std::string key_file;
  // The name to verify and to send as SNI. Query: tls_server_name=NAME
  std::string server_name;
  // false: no verification at all, for testing only. Query: tls_verify=false
  bool verify = true;
};

// Everything a URL says. Every field documents its default.
struct RedisConfig {
  // Where to connect: the one server, or the cluster's seed nodes (any
  // reachable one gives the slot map).
  std::vector<NodeAddress> nodes;
  bool cluster = false;
  // AUTH: empty user means the legacy "AUTH password" (Redis < 6 or the
  // default user). Empty password means no AUTH.
  std::string user;
  std::string password;
  // SELECT; from the URL path. Always 0 in a cluster. Default 0.
  int db = 0;
  // Prepended to every key and channel, so that several users (and tests)
  // share one Redis. Must not contain '{' or '}' (they would override the
  // per-record hash tag). Default empty. Query: prefix=
  std::string prefix;
  // TCP connect timeout. Default 1 s. Query: connect_timeout=1s
  Duration connect_timeout{1'000};
  // Per-command read/write timeout. Default 2 s. Query: timeout=2s
  Duration command_timeout{2'000};
  // Idle connections kept per node. A call that finds none idle opens one,
  // and it is closed afterwards if `pool` are idle already: keep this at
  // least the front's concurrency (worker threads), or busy fronts open and
  // close a connection per call. Default 64. Query: pool=64
  size_t pool = 64;
  // Approximate bound of the audit stream (XADD MAXLEN ~). Default
  // 1,000,000. Query: attempts_maxlen=
  size_t attempts_maxlen = 1'000'000;
  // Audit entries one query (Store::QueryAttempts: `idemgate audit`,
  // GET /v1/attempts) examines at most, newest first; it answers what it
  // found and says it stopped (AttemptFilter::cut). 0: no cap. Default
  // 10,000. Query: attempts_scan=10000
  size_t attempts_scan = 10'000;
  // After each record write, WAIT for this many replicas to acknowledge it;
  // 0 (default) does not wait. Query: wait_replicas=N
  int wait_replicas = 0;
  // How long WAIT blocks. Default 1 s. Query: wait_timeout=1s
  Duration wait_timeout{1'000};
  // How long a deleted (released, evicted, purged) record leaves a tombstone
  // holding its fence, so that fences keep growing across deletion even
  // between instances whose clocks disagree. Default 7 days.
  // Query: fence_floor_keep=7d
  Duration fence_floor_keep{7LL * 24 * 3'600'000};
  // An outcome body of up to 100 times this many bytes is stored as fields
  // of at most this many bytes, so that the record's hash stays a compact
  // listpack (redis_codec.h EncodeOutcome). Keep it at most the server's
  // hash-max-listpack-value (64 by default); 0 stores every body in one
  // field. Default 64. Query: body_field_bytes=64
  size_t body_field_bytes = 64;
  // TLS: on for rediss://; the tls_* options above.
  TlsOptions tls;
};

// True for the schemes this backend answers: redis:, rediss:, redis+cluster:,
// rediss+cluster:.
bool IsRedisUrl(std::string_view url);

// Parses a redis URL. kInvalidArgument for a malformed URL, an unknown
// option, a cluster URL with a database other than 0, or a prefix with '{'
// or '}', tls_* options without rediss://, or tls_cert without tls_key (or
// the reverse). Files are not read here (RedisClient::Open loads them).
Result<RedisConfig> ParseRedisUrl(std::string_view url);

}  // namespace idem::redis

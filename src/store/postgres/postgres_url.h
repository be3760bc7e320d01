// The store URL of the PostgreSQL backend, taken apart without any I/O.
//
//   postgres://USER[:PASSWORD]@HOST[:PORT]/DBNAME?schema=NAME&pool_size=N&LIBPQ_PARAM=...
//
// `schema` and `pool_size` are idemgate's own; every other query parameter
// (sslmode, connect_timeout, application_name, ...) goes to libpq as it is.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/error.h"

namespace idem::postgres {

struct PostgresUrl {
  // libpq keyword/value pairs for PQconnectdbParams, with idemgate's defaults
  // (connect_timeout 5 s, TCP keepalives, tcp_user_timeout 30 s,
  // application_name "idemgate") for the keywords the URL leaves unset.
  std::vector<std::pair<std::string, std::string>> conninfo;
  // The schema that holds the store's tables; created on first use.
  // Default "public". Several stores may share a database, one schema each.
  std::string schema = "public";
  // Most connections the store keeps open for requests (the LISTEN
  // connection comes on top), opened on demand. Default 16: a call holds one
  // for each of its claim and completion, and concurrent commits share WAL
  // flushes only if they can be in flight together (bench/README.md).
  size_t pool_size = 16;
  // "host:port/dbname schema NAME", for messages. Never holds the password.
  std::string where;
};

// kInvalidArgument, naming what is wrong, for a URL libpq cannot parse, a bad
// schema (empty, longer than 63 bytes) or a pool_size outside 1..256.
Result<PostgresUrl> ParsePostgresUrl(std::string_view url);

}  // namespace idem::postgres

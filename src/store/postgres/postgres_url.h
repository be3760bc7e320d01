// The store URL of the PostgreSQL backend, taken apart without any I/O.
//
//   postgres://USER[:PASSWORD]@HOST[:PORT]/DBNAME?schema=NAME&pool_size=N&batch_size=N
//       &batch_writers=N&read_before_claim=on|off&LIBPQ_PARAM=...
//
// `schema`, `pool_size`, `batch_size`, `batch_writers` and `read_before_claim` are idemgate's
// own; every other query parameter (sslmode, connect_timeout, application_name, ...) goes to
// libpq as it is.
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
  // Most claims and completions that share one transaction (BatchWriter):
  // concurrent calls share a commit instead of each paying for its own.
  // Default 16; 1 runs each write in a transaction of its own on the
  // caller's connection (no writer threads).
  size_t batch_size = 16;
  // Threads (each with one pooled connection while it runs a batch) that run
  // batches: while one commits, the next batch runs its statements. Default
  // 2; capped at pool_size.
  size_t batch_writers = 2;
  // Whether a claim first reads the key on a pooled connection, so that a
  // duplicate is answered from committed rows without waiting for a batch.
  // Default off: the read is a round trip and a transaction of its own for
  // every fresh claim, more than half of the server's CPU for one call
  // (bench/README.md run GG); a duplicate is answered by its claim's batch.
  bool read_before_claim = false;
  // "host:port/dbname schema NAME", for messages. Never holds the password.
  std::string where;
};

// kInvalidArgument, naming what is wrong, for a URL libpq cannot parse, a bad
// schema (empty, longer than 63 bytes), a pool_size outside 1..256, a
// batch_size or batch_writers outside 1..1024, a read_before_claim neither
// on nor off.
Result<PostgresUrl> ParsePostgresUrl(std::string_view url);

}  // namespace idem::postgres

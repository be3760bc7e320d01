// The Redis store (docs/DESIGN.md §5): one hash per record, Lua scripts for every
// fence-conditional change, native TTL for garbage collection, pub/sub to
// wake waiters across instances, a stream for the audit log. Works on one
// server and on Redis Cluster (every record operation touches one slot).
//
// URLs: see redis_url.h. Durability is the server's: with `appendonly yes`
// and `appendfsync always` a completion acknowledged by the store survives a
// Redis crash; `?wait_replicas=N` also waits for N replicas.
#pragma once

#include <memory>
#include <string_view>

#include "idem/clock.h"
#include "idem/store.h"

namespace idem {

// Connects (single server: PING; cluster: CLUSTER SLOTS) and returns the
// store. kInvalidArgument for a bad URL or TLS files that cannot be loaded,
// kUnavailable if no server answers (or a TLS handshake fails). `clock` must outlive the
// store. options.poll_interval is how often a waiter re-reads a record when
// no pub/sub message came (a lost message only delays).
Result<std::unique_ptr<Store>> OpenRedisStore(std::string_view url, Clock& clock,
                                              const StoreOptions& options = {});

}  // namespace idem

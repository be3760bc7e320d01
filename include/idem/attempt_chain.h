// The hash chain of the audit log (docs/DESIGN.md §7): what an entry's hash
// covers, how a store appends an entry to its tenant's chain, and the walk
// that `idemgate audit --verify` makes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "idem/error.h"
#include "idem/record.h"

namespace idem {

class Store;

// SHA-256, lowercase hex, of the entry's canonical encoding: the tag
// "idemgate-attempt-v1", then seq (8 bytes, big-endian), prev_hash, at (Unix
// ms, 8 bytes, big-endian two's complement), tenant, key, tool, turn, the
// outcome's name, latency (ms, 8 bytes), instance and detail; every string
// as its length (8 bytes, big-endian) and its bytes. `a`'s own seq,
// prev_hash and hash are not read. PostgreSQL computes the same in SQL
// (pg_schema.cc, idemgate_chain_hash).
std::string ChainHash(const Attempt& a, uint64_t seq, std::string_view prev_hash);

// Makes `a` the next entry of `head`'s chain: sets its seq, prev_hash and
// hash, and moves `head` to it. For stores that append under their own lock
// or transaction (memory, SQLite, Redis's client side).
void ChainAppend(ChainHead& head, Attempt& a);

// Where `idemgate audit --verify` found the chain broken.
struct ChainFault {
  enum class Kind {
    kEdited,    // the entry's hash is not the hash of its fields
    kDeleted,   // entries are missing before this one (a seq gap), or at the end
    kInserted,  // an entry that does not follow its predecessor: a second entry with
                // its seq, or one whose prev_hash is not its predecessor's hash
  };
  Kind kind = Kind::kEdited;
  Attempt entry;        // the entry named (for a deletion at the end: the last one kept)
  std::string message;  // one line naming the tenant, seq, key and time
};

struct ChainReport {
  uint64_t checked = 0;             // chained entries checked
  uint64_t tenants = 0;             // tenants whose chain was walked
  uint64_t before_chain = 0;        // entries written before the chain existed (seq 0)
  uint64_t restarted = 0;           // tenants whose chain starts after a purge or trim
  std::optional<ChainFault> fault;  // the first break found; nullopt: every chain holds
};

// Walks every tenant's chain (only `tenant`'s, if given) oldest to newest,
// `page` entries at a time (memory: one state per tenant, never the log),
// and stops at the first break. Errors: the store's.
Result<ChainReport> VerifyChains(Store& store, const std::optional<std::string>& tenant,
                                 size_t page = 1000);

}  // namespace idem

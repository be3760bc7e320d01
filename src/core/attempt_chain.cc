#include "idem/attempt_chain.h"

#include <map>

#include "idem/canonical_json.h"
#include "idem/store.h"

namespace idem {
namespace {

void PutU64(std::string& out, uint64_t v) {
  for (int i = 7; i >= 0; --i) out += static_cast<char>((v >> (8 * i)) & 0xFF);
}

void PutText(std::string& out, std::string_view s) {
  PutU64(out, s.size());
  out += s;
}

std::string Name(const Attempt& a) {
  return "tenant \"" + a.tenant + "\" seq " + std::to_string(a.seq) + " (key \"" + a.key + "\", " +
         FormatIsoTime(a.at) + ", " + std::string(AttemptOutcomeName(a.outcome)) + ")";
}

ChainFault Fault(ChainFault::Kind kind, const Attempt& a, const std::string& what) {
  static constexpr const char* kKinds[] = {"edited", "deleted", "inserted out of order"};
  return ChainFault{kind, a, Name(a) + ": " + kKinds[static_cast<int>(kind)] + ": " + what};
}

std::string Range(uint64_t from, uint64_t to) {
  return from == to ? "entry " + std::to_string(from)
                    : "entries " + std::to_string(from) + ".." + std::to_string(to);
}

// What the walk knows of one tenant's chain so far.
struct Walk {
  bool started = false;
  Attempt last;  // the last chained entry checked
};

}  // namespace

std::string ChainHash(const Attempt& a, uint64_t seq, std::string_view prev_hash) {
  std::string enc;
  enc.reserve(160 + a.tenant.size() + a.key.size() + a.tool.size() + a.turn.size() +
              a.instance.size() + a.detail.size());
  PutText(enc, "idemgate-attempt-v1");
  PutU64(enc, seq);
  PutText(enc, prev_hash);
  PutU64(enc, static_cast<uint64_t>(ToUnixMillis(a.at)));
  PutText(enc, a.tenant);
  PutText(enc, a.key);
  PutText(enc, a.tool);
  PutText(enc, a.turn);
  PutText(enc, AttemptOutcomeName(a.outcome));
  PutU64(enc, static_cast<uint64_t>(a.latency.count()));
  PutText(enc, a.instance);
  PutText(enc, a.detail);
  // Not OpenSSL's SHA256(), which looks the digest up in the provider
  // again for every entry (2 000 instructions of a replay's 110 000).
  return Sha256Hex(enc);
}

void ChainAppend(ChainHead& head, Attempt& a) {
  a.seq = head.seq + 1;
  a.prev_hash = head.hash;
  a.hash = ChainHash(a, a.seq, a.prev_hash);
  head.seq = a.seq;
  head.hash = a.hash;
}

Result<ChainReport> VerifyChains(Store& store, const std::optional<std::string>& tenant,
                                 size_t page) {
  auto heads_list = store.ChainHeads(tenant);
  if (!heads_list) return std::unexpected(heads_list.error());
  std::map<std::string, ChainHead> heads;
  for (ChainHead& h : *heads_list) heads.emplace(h.tenant, std::move(h));

  ChainReport report;
  std::map<std::string, Walk> walks;
  std::string cursor;
  do {
    auto got = store.ReadChain(tenant, cursor, page);
    if (!got) return std::unexpected(got.error());
    for (Attempt& e : got->entries) {
      if (e.seq == 0) {
        ++report.before_chain;
        continue;
      }
      auto h = heads.find(e.tenant);
      if (h == heads.end()) {
        report.fault = Fault(ChainFault::Kind::kInserted, e,
                             "its tenant has no chain head (the entry was added, or the head "
                             "removed, by something other than idemgate)");
        return report;
      }
      Walk& w = walks[e.tenant];
      if (ChainHash(e, e.seq, e.prev_hash) != e.hash) {
        report.fault =
            Fault(ChainFault::Kind::kEdited, e, "its hash is not the hash of its fields");
        return report;
      }
      if (!w.started) {
        const ChainHead& head = h->second;
        if (e.seq > head.start_seq) {
          report.fault = Fault(ChainFault::Kind::kDeleted, e,
                               Range(head.start_seq, e.seq - 1) + " before it are missing" +
                                   (head.start_seq > 1 ? " (the chain restarts at " +
                                                             std::to_string(head.start_seq) + ")"
                                                       : std::string()));
          return report;
        }
        if (e.seq < head.start_seq) {
          report.fault = Fault(
              ChainFault::Kind::kInserted, e,
              "it is older than the chain's start (seq " + std::to_string(head.start_seq) + ")");
          return report;
        }
        if (e.prev_hash != head.start_prev) {
          report.fault =
              Fault(ChainFault::Kind::kInserted, e,
                    head.start_seq > 1 ? "its previous hash is not the one the purge recorded"
                                       : "the tenant's first entry has a previous hash");
          return report;
        }
      } else {
        const Attempt& last = w.last;
        if (e.seq <= last.seq) {
          report.fault =
              Fault(ChainFault::Kind::kInserted, e,
                    e.seq == last.seq ? "a second entry with this seq"
                                      : "it comes after seq " + std::to_string(last.seq));
          return report;
        }
        if (e.seq > last.seq + 1) {
          report.fault = Fault(ChainFault::Kind::kDeleted, e,
                               Range(last.seq + 1, e.seq - 1) + " before it are missing");
          return report;
        }
        if (e.prev_hash != last.hash) {
          report.fault = Fault(ChainFault::Kind::kInserted, e,
                               "its previous hash is not the hash of seq " +
                                   std::to_string(last.seq) + " (one of the two was rewritten)");
          return report;
        }
      }
      w.started = true;
      w.last = std::move(e);
      ++report.checked;
    }
    cursor = std::move(got->next);
  } while (!cursor.empty());

  for (const auto& [name, head] : heads) {
    if (head.start_seq > 1) ++report.restarted;
    auto it = walks.find(name);
    if (it == walks.end()) {
      if (head.seq >= head.start_seq) {
        Attempt none;
        none.tenant = name;
        none.seq = head.seq;
        report.fault = ChainFault{
            ChainFault::Kind::kDeleted, none,
            "tenant \"" + name + "\": deleted: " + Range(head.start_seq, head.seq) +
                " of its chain are missing (its head is at seq " + std::to_string(head.seq) + ")"};
        return report;
      }
      continue;
    }
    ++report.tenants;
    const Attempt& last = it->second.last;
    if (last.seq < head.seq) {
      report.fault =
          Fault(ChainFault::Kind::kDeleted, last,
                Range(last.seq + 1, head.seq) + " after it are missing (the head is at " +
                    std::to_string(head.seq) + ")");
      return report;
    }
    if (last.seq > head.seq) {
      report.fault = Fault(ChainFault::Kind::kInserted, last,
                           "it is past the chain's head (seq " + std::to_string(head.seq) + ")");
      return report;
    }
    if (last.hash != head.hash) {
      report.fault = Fault(ChainFault::Kind::kEdited, last,
                           "the newest entry's hash is not the chain head's (it was rewritten)");
      return report;
    }
  }
  return report;
}

}  // namespace idem

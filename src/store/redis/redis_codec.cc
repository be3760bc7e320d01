#include "redis_codec.h"

#include <algorithm>
#include <charconv>

namespace idem::redis {
namespace {

std::string Escape(std::string_view s, bool tenant) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '%' || c == '{' || c == '}' || (tenant && c == ':')) {
      static constexpr char kHex[] = "0123456789ABCDEF";
      out += '%';
      out += kHex[(static_cast<unsigned char>(c) >> 4) & 0xF];
      out += kHex[static_cast<unsigned char>(c) & 0xF];
    } else {
      out += c;
    }
  }
  return out;
}

std::string_view Bytes(const redisReply& r) {
  if (r.type == REDIS_REPLY_STRING || r.type == REDIS_REPLY_STATUS) return {r.str, r.len};
  return {};
}

template <typename T>
bool ToNumber(std::string_view s, T* out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

Error Corrupt(const RecordId& id, std::string_view what) {
  return Error{ErrorCode::kDataLoss,
               "redis store: record \"" + id.key + "\" of tenant \"" + id.tenant + "\" has " +
                   std::string(what) +
                   "; it was written by an incompatible program: evict the record"};
}

}  // namespace

RecordKeys KeysOf(std::string_view prefix, const RecordId& id) {
  std::string base =
      std::string(prefix) + "idem:{" + Escape(id.tenant, true) + ":" + Escape(id.key, false) + "}:";
  return RecordKeys{base + "r", base + "c"};
}

std::string EvictionChannel(std::string_view prefix) {
  return std::string(prefix) + "idem:evictions";
}

std::string RecordKeyPattern(std::string_view prefix) {
  std::string out;
  for (char c : prefix) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out += '\\';
    out += c;
  }
  return out + "idem:{*}:r";
}

std::string AttemptStreamKey(std::string_view prefix) {
  return std::string(prefix) + "idem:attempts";
}

std::string AttemptHeadsKey(std::string_view prefix) {
  const std::string stream = AttemptStreamKey(prefix);
  return stream + ":heads{" + stream + "}";
}

std::string ChainHeadValue(const ChainHead& head) {
  return std::to_string(head.seq) + " " + head.hash + " " + std::to_string(head.start_seq) + " " +
         head.start_prev;
}

std::vector<std::string> RecordFieldNames() {
  return {"st", "fp", "tool", "turn", "fence", "cr", "le", "co", "ex", "oc", "ow", "rt"};
}

namespace {

constexpr std::string_view kSplitSuffix = "/fields";

// The values of one record's fields, as RecordFieldNames orders them, and
// its body: 'ob', or the o1, o2, … fields of a split one.
struct RecordFields {
  std::optional<std::string_view> named[12];
  std::optional<std::string_view> whole_body;
  std::vector<std::pair<size_t, std::string_view>> body_parts;  // (n of "o<n>", value)
};

std::optional<std::string_view> Value(const redisReply& r) {
  if (r.type == REDIS_REPLY_NIL) return std::nullopt;
  return Bytes(r);
}

Result<std::optional<Record>> Decode(const RecordId& id, RecordFields f, bool with_body) {
  auto at = [&](size_t i) { return f.named[i].value_or(std::string_view()); };
  if (!f.named[0]) return std::optional<Record>();  // absent, or a tombstone
  Record r;
  r.id = id;
  auto state = ParseRecordState(at(0));
  if (!state) return std::unexpected(Corrupt(id, "an unknown state"));
  r.state = *state;
  r.fingerprint = std::string(at(1));
  r.tool = std::string(at(2));
  r.turn = std::string(at(3));
  if (!ToNumber(at(4), &r.fence)) return std::unexpected(Corrupt(id, "no fence"));
  int64_t ms[4];
  for (int i = 0; i < 4; ++i) {
    if (!ToNumber(at(5 + i), &ms[i])) return std::unexpected(Corrupt(id, "a bad time"));
  }
  r.created_at = FromUnixMillis(ms[0]);
  r.lease_expires_at = FromUnixMillis(ms[1]);
  r.completed_at = FromUnixMillis(ms[2]);
  r.expires_at = FromUnixMillis(ms[3]);
  r.owner = std::string(at(10));  // none in a record older than owner tokens
  int64_t retention_ms = 0;        // none in a record older than kept retention
  if (f.named[11] && ToNumber(*f.named[11], &retention_ms)) r.retention = Duration(retention_ms);
  if (!f.named[9]) return std::optional<Record>(std::move(r));
  std::string_view cls_name = *f.named[9];
  const bool split = cls_name.ends_with(kSplitSuffix);
  if (split) cls_name.remove_suffix(kSplitSuffix.size());
  auto cls = ParseOutcomeClass(cls_name);
  if (!cls) return std::unexpected(Corrupt(id, "an unknown outcome class"));
  Outcome o;
  o.cls = *cls;
  if (with_body && !split) {
    o.body = std::string(f.whole_body.value_or(std::string_view()));
  } else if (with_body) {
    auto& parts = f.body_parts;
    std::sort(parts.begin(), parts.end());
    for (size_t i = 0; i < parts.size(); ++i) {
      if (parts[i].first != i + 1) return std::unexpected(Corrupt(id, "a body with a gap"));
      o.body += parts[i].second;
    }
  }
  r.outcome = std::move(o);
  return std::optional<Record>(std::move(r));
}

}  // namespace

OutcomeFields EncodeOutcome(const Outcome& outcome, size_t field_bytes) {
  OutcomeFields out;
  out.cls = std::string(OutcomeClassName(outcome.cls));
  const std::string& body = outcome.body;
  if (field_bytes == 0 || body.size() > kMaxBodyFields * field_bytes) {
    out.pairs = {"ob", body};
    return out;
  }
  out.cls += kSplitSuffix;
  for (size_t at = 0, n = 1; at < body.size(); at += field_bytes, ++n) {
    out.pairs.push_back("o" + std::to_string(n));
    out.pairs.push_back(body.substr(at, field_bytes));
  }
  return out;
}

Result<std::optional<Record>> DecodeRecord(const RecordId& id, const redisReply& fields) {
  RecordFields f;
  if (fields.type != REDIS_REPLY_ARRAY || fields.elements != std::size(f.named)) {
    return std::unexpected(Corrupt(id, "an unexpected shape"));
  }
  for (size_t i = 0; i < fields.elements; ++i) f.named[i] = Value(*fields.element[i]);
  return Decode(id, std::move(f), /*with_body=*/false);
}

Result<std::optional<Record>> DecodeRecordHash(const RecordId& id, const redisReply& hash) {
  if (hash.type != REDIS_REPLY_ARRAY || hash.elements % 2 != 0) {
    return std::unexpected(Corrupt(id, "an unexpected shape"));
  }
  static const std::vector<std::string> kNames = RecordFieldNames();
  RecordFields f;
  for (size_t i = 0; i < hash.elements; i += 2) {
    const std::string_view name = Bytes(*hash.element[i]);
    const std::string_view value = Bytes(*hash.element[i + 1]);
    if (name == "ob") {
      f.whole_body = value;
      continue;
    }
    size_t n = 0;
    if (name.starts_with('o') && ToNumber(name.substr(1), &n)) {
      f.body_parts.emplace_back(n, value);
      continue;
    }
    const auto known = std::find(kNames.begin(), kNames.end(), name);
    if (known != kNames.end()) f.named[known - kNames.begin()] = value;
  }
  return Decode(id, std::move(f), /*with_body=*/true);
}

Result<ChainHead> ParseChainHead(std::string_view tenant, std::string_view value) {
  ChainHead head;
  head.tenant = std::string(tenant);
  std::vector<std::string_view> parts;
  for (size_t start = 0;;) {
    const size_t space = value.find(' ', start);
    parts.push_back(value.substr(start, space == std::string_view::npos ? space : space - start));
    if (space == std::string_view::npos) break;
    start = space + 1;
  }
  if ((parts.size() != 4 && parts.size() != 6) || !ToNumber(parts[0], &head.seq) ||
      !ToNumber(parts[2], &head.start_seq)) {
    return MakeError(ErrorCode::kDataLoss, "redis store: the chain head of tenant \"" +
                                               head.tenant + "\" is malformed: \"" +
                                               std::string(value) + "\"");
  }
  head.hash = std::string(parts[1]);
  head.start_prev = std::string(parts[3]);
  return head;
}

std::vector<std::string> EncodeAttempt(const Attempt& a) {
  return {std::to_string(ToUnixMillis(a.at)),
          a.tenant,
          a.key,
          a.tool,
          a.turn,
          std::string(AttemptOutcomeName(a.outcome)),
          std::to_string(a.latency.count()),
          a.instance,
          a.detail,
          std::to_string(a.seq),
          a.prev_hash,
          a.hash};
}

Result<Attempt> DecodeAttempt(const redisReply& fields) {
  auto bad = [](std::string_view what) {
    return MakeError(ErrorCode::kDataLoss, "redis store: an attempt in the audit stream has " +
                                               std::string(what) +
                                               "; it was written by an incompatible program");
  };
  if (fields.type != REDIS_REPLY_ARRAY || fields.elements % 2 != 0) return bad("a bad shape");
  Attempt a;
  for (size_t i = 0; i + 1 < fields.elements; i += 2) {
    const std::string_view name = Bytes(*fields.element[i]);
    const std::string_view value = Bytes(*fields.element[i + 1]);
    if (name == "at") {
      int64_t ms;
      if (!ToNumber(value, &ms)) return bad("a bad time");
      a.at = FromUnixMillis(ms);
    } else if (name == "tenant") {
      a.tenant = value;
    } else if (name == "key") {
      a.key = value;
    } else if (name == "tool") {
      a.tool = value;
    } else if (name == "turn") {
      a.turn = value;
    } else if (name == "outcome") {
      auto o = ParseAttemptOutcome(value);
      if (!o) return bad("an unknown outcome");
      a.outcome = *o;
    } else if (name == "latency") {
      int64_t ms;
      if (!ToNumber(value, &ms)) return bad("a bad latency");
      a.latency = Duration(ms);
    } else if (name == "instance") {
      a.instance = value;
    } else if (name == "detail") {
      a.detail = value;
    } else if (name == "seq") {  // none in entries from before the chain
      if (!ToNumber(value, &a.seq)) return bad("a bad seq");
    } else if (name == "prev") {
      a.prev_hash = value;
    } else if (name == "hash") {
      a.hash = value;
    }
  }
  return a;
}

Result<TimePoint> DecodeTime(const redisReply& reply) {
  int64_t seconds = 0;
  int64_t micros = 0;
  if (reply.type != REDIS_REPLY_ARRAY || reply.elements != 2 ||
      !ToNumber(Bytes(*reply.element[0]), &seconds) ||
      !ToNumber(Bytes(*reply.element[1]), &micros)) {
    return MakeError(ErrorCode::kInternal,
                     "redis store: TIME did not answer seconds and microseconds");
  }
  return FromUnixMillis(seconds * 1000 + micros / 1000);
}

}  // namespace idem::redis

#include "redis_codec.h"

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

std::vector<std::string> RecordFieldNames(bool with_body) {
  std::vector<std::string> f = {"st", "fp", "tool", "turn", "fence", "cr",
                                "le", "co", "ex",   "oc",   "ow"};
  if (with_body) f.push_back("ob");
  return f;
}

Result<std::optional<Record>> DecodeRecord(const RecordId& id, const redisReply& fields) {
  if (fields.type != REDIS_REPLY_ARRAY || fields.elements < 11) {
    return std::unexpected(Corrupt(id, "an unexpected shape"));
  }
  auto at = [&](size_t i) -> const redisReply& { return *fields.element[i]; };
  if (at(0).type == REDIS_REPLY_NIL) return std::optional<Record>();  // absent, or a tombstone
  Record r;
  r.id = id;
  auto state = ParseRecordState(Bytes(at(0)));
  if (!state) return std::unexpected(Corrupt(id, "an unknown state"));
  r.state = *state;
  r.fingerprint = std::string(Bytes(at(1)));
  r.tool = std::string(Bytes(at(2)));
  r.turn = std::string(Bytes(at(3)));
  if (!ToNumber(Bytes(at(4)), &r.fence)) return std::unexpected(Corrupt(id, "no fence"));
  int64_t ms[4];
  for (int i = 0; i < 4; ++i) {
    if (!ToNumber(Bytes(at(5 + i)), &ms[i])) return std::unexpected(Corrupt(id, "a bad time"));
  }
  r.created_at = FromUnixMillis(ms[0]);
  r.lease_expires_at = FromUnixMillis(ms[1]);
  r.completed_at = FromUnixMillis(ms[2]);
  r.expires_at = FromUnixMillis(ms[3]);
  r.owner = std::string(Bytes(at(10)));  // nil (a record older than owner tokens): none
  if (at(9).type != REDIS_REPLY_NIL) {
    auto cls = ParseOutcomeClass(Bytes(at(9)));
    if (!cls) return std::unexpected(Corrupt(id, "an unknown outcome class"));
    Outcome o;
    o.cls = *cls;
    if (fields.elements > 11) o.body = std::string(Bytes(at(11)));
    r.outcome = std::move(o);
  }
  return std::optional<Record>(std::move(r));
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
          a.detail};
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
    }
  }
  return a;
}

}  // namespace idem::redis

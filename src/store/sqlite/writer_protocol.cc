#include "writer_protocol.h"

#include <utility>

namespace idem::sqlite::wire {
namespace {

enum class Tag : uint8_t { kClaim = 1, kComplete = 2, kAppend = 3 };

class Out {
 public:
  void U8(uint8_t v) { bytes_.push_back(static_cast<char>(v)); }
  void U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) bytes_.push_back(static_cast<char>(v >> (8 * i)));
  }
  void I64(int64_t v) { U64(static_cast<uint64_t>(v)); }
  void Str(std::string_view s) {
    const auto n = static_cast<uint32_t>(s.size());
    for (int i = 0; i < 4; ++i) bytes_.push_back(static_cast<char>(n >> (8 * i)));
    bytes_.append(s);
  }
  void Time(TimePoint t) { I64(ToUnixMillis(t)); }
  void Span(Duration d) { I64(d.count()); }
  std::string Take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

// Reads what Out wrote; any short or bad field makes ok() false, and every
// later read returns a zero value.
class In {
 public:
  explicit In(std::string_view bytes) : rest_(bytes) {}
  uint8_t U8() { return static_cast<uint8_t>(Fixed(1)); }
  uint64_t U64() { return Fixed(8); }
  // 0 or 1; anything else is not a message of ours.
  bool Flag() { return Enum(uint8_t{1}) == 1; }
  // An enumerator of E, whose largest is `last`.
  template <typename E>
  E Enum(E last) {
    const uint8_t v = U8();
    if (v > static_cast<uint8_t>(last)) return Bad<E>();
    return static_cast<E>(v);
  }
  int64_t I64() { return static_cast<int64_t>(Fixed(8)); }
  std::string Str() {
    const auto n = static_cast<size_t>(Fixed(4));
    if (!ok_ || n > rest_.size()) return Bad<std::string>();
    std::string s(rest_.substr(0, n));
    rest_.remove_prefix(n);
    return s;
  }
  TimePoint Time() { return FromUnixMillis(I64()); }
  Duration Span() { return Duration(I64()); }
  // True if every read succeeded and nothing is left over.
  bool Done() const { return ok_ && rest_.empty(); }

 private:
  uint64_t Fixed(size_t width) {
    if (!ok_ || rest_.size() < width) return Bad<uint64_t>();
    uint64_t v = 0;
    for (size_t i = 0; i < width; ++i) {
      v |= static_cast<uint64_t>(static_cast<uint8_t>(rest_[i])) << (8 * i);
    }
    rest_.remove_prefix(width);
    return v;
  }
  template <typename T>
  T Bad() {
    ok_ = false;
    rest_ = {};
    return T{};
  }

  std::string_view rest_;
  bool ok_ = true;
};

void PutId(Out& out, const RecordId& id) {
  out.Str(id.tenant);
  out.Str(id.key);
}
RecordId GetId(In& in) {
  RecordId id;
  id.tenant = in.Str();
  id.key = in.Str();
  return id;
}

void PutAttempt(Out& out, const Attempt& a) {
  out.Time(a.at);
  out.Str(a.tenant);
  out.Str(a.key);
  out.Str(a.tool);
  out.Str(a.turn);
  out.U8(static_cast<uint8_t>(a.outcome));
  out.Span(a.latency);
  out.Str(a.instance);
  out.Str(a.detail);
}
Attempt GetAttempt(In& in) {
  Attempt a;
  a.at = in.Time();
  a.tenant = in.Str();
  a.key = in.Str();
  a.tool = in.Str();
  a.turn = in.Str();
  a.outcome = in.Enum(AttemptOutcome::kEvicted);
  a.latency = in.Span();
  a.instance = in.Str();
  a.detail = in.Str();
  return a;
}

void PutOptionalAttempt(Out& out, const Attempt* a) {
  out.U8(a ? 1 : 0);
  if (a) PutAttempt(out, *a);
}
std::optional<Attempt> GetOptionalAttempt(In& in) {
  if (!in.Flag()) return std::nullopt;
  return GetAttempt(in);
}

void PutRecord(Out& out, const Record& r) {
  PutId(out, r.id);
  out.U8(static_cast<uint8_t>(r.state));
  out.Str(r.fingerprint);
  out.Str(r.tool);
  out.Str(r.turn);
  out.U64(r.fence);
  out.Str(r.owner);
  out.Time(r.created_at);
  out.Time(r.lease_expires_at);
  out.Time(r.completed_at);
  out.Time(r.expires_at);
  out.Span(r.retention);
  out.U8(r.outcome ? 1 : 0);
  if (r.outcome) {
    out.U8(static_cast<uint8_t>(r.outcome->cls));
    out.Str(r.outcome->body);
  }
}
Record GetRecord(In& in) {
  Record r;
  r.id = GetId(in);
  r.state = in.Enum(RecordState::kUnknown);
  r.fingerprint = in.Str();
  r.tool = in.Str();
  r.turn = in.Str();
  r.fence = in.U64();
  r.owner = in.Str();
  r.created_at = in.Time();
  r.lease_expires_at = in.Time();
  r.completed_at = in.Time();
  r.expires_at = in.Time();
  r.retention = in.Span();
  if (in.Flag()) {
    Outcome o;
    o.cls = in.Enum(OutcomeClass::kTooLarge);
    o.body = in.Str();
    r.outcome = std::move(o);
  }
  return r;
}

// A reply starts with 0 (the write succeeded, its value follows) or 1 (it
// failed: the error's code, whether it was unreached, its message).
void PutError(Out& out, const Error& e) {
  out.U8(1);
  out.U8(static_cast<uint8_t>(e.code));
  out.U8(e.unreached ? 1 : 0);
  out.Str(e.message);
}

Error Malformed() {
  return Error{ErrorCode::kInternal,
               "sqlite store: the shared writer sent a reply this process cannot read; both "
               "run the same idemgate build, so this is a bug: please report it"};
}

// Reads a reply's status; on 1, the error it carries.
std::optional<Error> GetStatus(In& in) {
  if (!in.Flag()) return std::nullopt;
  Error e;
  e.code = in.Enum(ErrorCode::kInternal);
  e.unreached = in.Flag();
  e.message = in.Str();
  if (!in.Done()) return Malformed();
  return e;
}

}  // namespace

std::string EncodeClaim(const ClaimRequest& req, TimePoint now) {
  Out out;
  out.U8(static_cast<uint8_t>(Tag::kClaim));
  out.Time(now);
  PutId(out, req.id);
  out.Str(req.fingerprint);
  out.Str(req.tool);
  out.Str(req.turn);
  out.Span(req.lease);
  out.Span(req.retention);
  PutOptionalAttempt(out, req.logged ? &*req.logged : nullptr);
  out.Str(req.owner);
  return out.Take();
}

std::string EncodeComplete(const RecordId& id, uint64_t fence, const Outcome& outcome,
                           Duration retention, const Attempt* logged, TimePoint now) {
  Out out;
  out.U8(static_cast<uint8_t>(Tag::kComplete));
  out.Time(now);
  PutId(out, id);
  out.U64(fence);
  out.U8(static_cast<uint8_t>(outcome.cls));
  out.Str(outcome.body);
  out.Span(retention);
  PutOptionalAttempt(out, logged);
  return out.Take();
}

std::string EncodeAppend(const std::vector<Attempt>& attempts) {
  Out out;
  out.U8(static_cast<uint8_t>(Tag::kAppend));
  out.U64(attempts.size());
  for (const Attempt& a : attempts) PutAttempt(out, a);
  return out.Take();
}

Result<Call> DecodeCall(std::string_view bytes) {
  In in(bytes);
  Call call;
  bool known = true;
  switch (static_cast<Tag>(in.U8())) {
    case Tag::kClaim: {
      ClaimCall c;
      c.now = in.Time();
      c.req.id = GetId(in);
      c.req.fingerprint = in.Str();
      c.req.tool = in.Str();
      c.req.turn = in.Str();
      c.req.lease = in.Span();
      c.req.retention = in.Span();
      c.req.logged = GetOptionalAttempt(in);
      c.req.owner = in.Str();
      call = std::move(c);
      break;
    }
    case Tag::kComplete: {
      CompleteCall c;
      c.now = in.Time();
      c.id = GetId(in);
      c.fence = in.U64();
      c.outcome.cls = in.Enum(OutcomeClass::kTooLarge);
      c.outcome.body = in.Str();
      c.retention = in.Span();
      c.logged = GetOptionalAttempt(in);
      call = std::move(c);
      break;
    }
    case Tag::kAppend: {
      AppendCall c;
      const uint64_t n = in.U64();
      // Every attempt takes at least 8 + 4 * 6 + 1 + 8 bytes: no count can
      // ask for more entries than the bytes hold.
      if (n > bytes.size() / 41) {
        known = false;
        break;
      }
      c.attempts.reserve(n);
      for (uint64_t i = 0; i < n; ++i) c.attempts.push_back(GetAttempt(in));
      call = std::move(c);
      break;
    }
    default:
      known = false;
      break;
  }
  if (!known || !in.Done()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "sqlite shared writer: a call it cannot read (not an idemgate write of "
                     "protocol version 1); refused, nothing written");
  }
  return call;
}

std::string EncodeReply(const Result<ClaimResult>& result) {
  Out out;
  if (!result) {
    PutError(out, result.error());
  } else {
    out.U8(0);
    out.U8(result->claimed ? 1 : 0);
    PutRecord(out, result->record);
  }
  return out.Take();
}

std::string EncodeReply(const Result<Record>& result) {
  Out out;
  if (!result) {
    PutError(out, result.error());
  } else {
    out.U8(0);
    PutRecord(out, *result);
  }
  return out.Take();
}

std::string EncodeReply(const Result<void>& result) {
  Out out;
  if (!result) {
    PutError(out, result.error());
  } else {
    out.U8(0);
  }
  return out.Take();
}

Result<ClaimResult> DecodeClaimReply(std::string_view bytes) {
  In in(bytes);
  if (auto e = GetStatus(in)) return std::unexpected(std::move(*e));
  ClaimResult r;
  r.claimed = in.Flag();
  r.record = GetRecord(in);
  if (!in.Done()) return std::unexpected(Malformed());
  return r;
}

Result<Record> DecodeRecordReply(std::string_view bytes) {
  In in(bytes);
  if (auto e = GetStatus(in)) return std::unexpected(std::move(*e));
  Record r = GetRecord(in);
  if (!in.Done()) return std::unexpected(Malformed());
  return r;
}

Result<void> DecodeVoidReply(std::string_view bytes) {
  In in(bytes);
  if (auto e = GetStatus(in)) return std::unexpected(std::move(*e));
  if (!in.Done()) return std::unexpected(Malformed());
  return {};
}

}  // namespace idem::sqlite::wire

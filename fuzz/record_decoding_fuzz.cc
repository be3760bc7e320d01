// Each store's decoding of a stored record from the bytes a server (or the
// SQLite file) hands back, without a server:
//  - Redis: DecodeRecord / DecodeAttempt of an HMGET / stream-entry reply
//    (redis_codec.h), built here as hiredis would;
//  - PostgreSQL: DecodeRecord of a binary-format result row (record_rows.h),
//    built with libpq's PQmakeEmptyPGresult / PQsetvalue, no connection;
//  - SQLite: ReadRecord of a row inserted with arbitrary column values into
//    an in-memory database with the real schema (sqlite_rows.h);
//  - the HTTP reverse proxy's outcome body: DecodeStoredResponse
//    (src/fronts/http_proxy/stored_response.h), selector 'h', the rest of the input as is.
// Properties: a row that does not decode is kDataLoss with a message, never
// a crash; a decoded record holds exactly the stored state and numbers; a
// SQLite record written back and read again is the same record.
//
// Input: one selector byte ('r', 'p', 's', 'h'; others pick by value), then
// fields separated by 0x1F. A field's first byte tags its type: 'N' null,
// 'I' integer (decimal text), 'R' real (SQLite), 'B' bytes / blob, 'S' text;
// any other first byte is part of a text value.
#include <endian.h>
#include <hiredis/hiredis.h>
#include <libpq-fe.h>
#include <sqlite3.h>

#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.h"
#include "postgres/record_rows.h"
#include "fronts/http_proxy/stored_response.h"
#include "redis/redis_codec.h"
#include "sqlite/sqlite_rows.h"
#include "sqlite/sqlite_schema.h"

namespace {

struct Field {
  char tag = 'S';  // N, I, R, B or S
  std::string bytes;
  int64_t Int() const {
    int64_t v = 0;
    std::from_chars(bytes.data(), bytes.data() + bytes.size(), v);
    return v;
  }
};

std::vector<Field> SplitFields(std::string_view in) {
  std::vector<Field> out;
  while (true) {
    const size_t sep = in.find('\x1f');
    std::string_view f = in.substr(0, sep);
    Field field;
    if (!f.empty() && std::string_view("NIRBS").find(f.front()) != std::string_view::npos) {
      field.tag = f.front();
      f.remove_prefix(1);
    }
    field.bytes = std::string(f);
    out.push_back(std::move(field));
    if (sep == std::string_view::npos || out.size() == 16) break;
    in.remove_prefix(sep + 1);
  }
  return out;
}

const idem::RecordId kId{"tenant-a", "v1t.turn.tool.fp"};

void CheckDataLoss(const idem::Error& e) {
  FUZZ_CHECK(e.code == idem::ErrorCode::kDataLoss);
  FUZZ_CHECK(!e.message.empty());
}

// The fields of a decoded record that are stored as text in every store.
void CheckDecoded(const idem::Record& r, const std::vector<Field>& f) {
  FUZZ_CHECK(r.id == kId);
  FUZZ_CHECK_EQ(idem::RecordStateName(r.state), f[0].bytes);
  if (r.outcome) FUZZ_CHECK(f.size() > 9);
}

// --- Redis -------------------------------------------------------------------------------------

void FuzzRedis(const std::vector<Field>& fields) {
  std::vector<redisReply> elements(fields.size());
  std::vector<redisReply*> pointers;
  for (size_t i = 0; i < fields.size(); ++i) {
    redisReply& e = elements[i];
    std::memset(&e, 0, sizeof e);
    const Field& f = fields[i];
    switch (f.tag) {
      case 'N':
        e.type = REDIS_REPLY_NIL;
        break;
      case 'I':
        e.type = REDIS_REPLY_INTEGER;
        e.integer = f.Int();
        break;
      case 'R':
        e.type = REDIS_REPLY_ARRAY;  // an empty nested array
        break;
      default:
        e.type = f.tag == 'B' ? REDIS_REPLY_STATUS : REDIS_REPLY_STRING;
        e.str = const_cast<char*>(f.bytes.data());
        e.len = f.bytes.size();
        break;
    }
    pointers.push_back(&e);
  }
  redisReply array;
  std::memset(&array, 0, sizeof array);
  array.type = REDIS_REPLY_ARRAY;
  array.elements = pointers.size();
  array.element = pointers.data();

  const auto record = idem::redis::DecodeRecord(kId, array);
  if (!record) {
    CheckDataLoss(record.error());
  } else if (!record->has_value()) {
    FUZZ_CHECK(fields.size() >= 11 && fields[0].tag == 'N');
  } else {
    FUZZ_CHECK(fields.size() >= 11);
    CheckDecoded(**record, fields);
    uint64_t fence = 0;
    std::from_chars(fields[4].bytes.data(), fields[4].bytes.data() + fields[4].bytes.size(), fence);
    FUZZ_CHECK_EQ((*record)->fence, fence);
    FUZZ_CHECK_EQ((*record)->fingerprint,
                  fields[1].tag == 'N' || fields[1].tag == 'I' || fields[1].tag == 'R'
                      ? std::string()
                      : fields[1].bytes);
  }
  const auto attempt = idem::redis::DecodeAttempt(array);
  if (!attempt) CheckDataLoss(attempt.error());
}

// --- PostgreSQL --------------------------------------------------------------------------------

// The bigint a binary-format column holds (8 bytes, network order).
int64_t PgBigint(const Field& f) {
  if (f.tag == 'I') return f.Int();
  FUZZ_CHECK_EQ(f.bytes.size(), size_t{8});
  uint64_t be;
  std::memcpy(&be, f.bytes.data(), sizeof be);
  return static_cast<int64_t>(be64toh(be));
}

void FuzzPostgres(const std::vector<Field>& fields) {
  constexpr int kColumns = 13;  // state … owner, retention_ms, as the statements return them
  PGresult* result = PQmakeEmptyPGresult(nullptr, PGRES_TUPLES_OK);
  FUZZ_CHECK(result != nullptr);
  std::vector<PGresAttDesc> attrs(kColumns);
  std::vector<std::string> names(kColumns);
  for (int c = 0; c < kColumns; ++c) {
    names[c] = "c" + std::to_string(c);
    attrs[c] = PGresAttDesc{};
    attrs[c].name = names[c].data();
    attrs[c].format = 1;
    // int8, bytea, text
    attrs[c].typid = ((c >= 4 && c <= 8) || c == 12) ? 20 : (c == 10 ? 17 : 25);
    attrs[c].typlen = -1;
    attrs[c].atttypmod = -1;
  }
  FUZZ_CHECK(PQsetResultAttrs(result, kColumns, attrs.data()) != 0);
  for (int c = 0; c < kColumns; ++c) {
    if (static_cast<size_t>(c) >= fields.size()) {
      PQsetvalue(result, 0, c, nullptr, -1);
      continue;
    }
    const Field& f = fields[c];
    std::string value = f.bytes;
    if (f.tag == 'I') {
      const uint64_t be = htobe64(static_cast<uint64_t>(f.Int()));
      value.assign(reinterpret_cast<const char*>(&be), sizeof be);
    }
    if (f.tag == 'N') {
      PQsetvalue(result, 0, c, nullptr, -1);
    } else {
      PQsetvalue(result, 0, c, value.data(), static_cast<int>(value.size()));
    }
  }
  idem::postgres::Rows rows(result);  // owns `result` from here
  FUZZ_CHECK_EQ(rows.size(), 1);
  const auto record = idem::postgres::DecodeRecord(rows, 0, kId, "fuzz");
  if (!record) {
    CheckDataLoss(record.error());
    return;
  }
  CheckDecoded(*record, fields);
  FUZZ_CHECK(fields.size() > 8);
  FUZZ_CHECK_EQ(record->fence, static_cast<uint64_t>(PgBigint(fields[4])));
  FUZZ_CHECK_EQ(idem::ToUnixMillis(record->expires_at), PgBigint(fields[8]));
}

// --- SQLite ------------------------------------------------------------------------------------

idem::sqlite::Connection& SqliteConnection() {
  static std::unique_ptr<idem::sqlite::Connection> conn = [] {
    auto c = idem::sqlite::Connection::Open(":memory:", std::chrono::milliseconds(0));
    FUZZ_CHECK(c.has_value());
    FUZZ_CHECK(idem::sqlite::MigrateSchema(**c).has_value());
    return std::move(*c);
  }();
  return *conn;
}

void SameRecord(const idem::Record& a, const idem::Record& b) {
  FUZZ_CHECK(a.id == b.id);
  FUZZ_CHECK(a.state == b.state);
  FUZZ_CHECK_EQ(a.fingerprint, b.fingerprint);
  FUZZ_CHECK_EQ(a.tool, b.tool);
  FUZZ_CHECK_EQ(a.turn, b.turn);
  FUZZ_CHECK_EQ(a.fence, b.fence);
  FUZZ_CHECK_EQ(a.owner, b.owner);
  FUZZ_CHECK(a.created_at == b.created_at && a.lease_expires_at == b.lease_expires_at &&
             a.completed_at == b.completed_at && a.expires_at == b.expires_at);
  FUZZ_CHECK(a.outcome == b.outcome);
}

void FuzzSqlite(const std::vector<Field>& fields) {
  auto& conn = SqliteConnection();
  sqlite3* db = conn.handle();
  FUZZ_CHECK(sqlite3_exec(db, "DELETE FROM records", nullptr, nullptr, nullptr) == SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  FUZZ_CHECK(sqlite3_prepare_v2(db,
                                "INSERT INTO records (tenant, key, state, fingerprint, tool, turn, "
                                "fence, created_at_ms, lease_expires_at_ms, completed_at_ms, "
                                "expires_at_ms, outcome_class, outcome_body, owner) VALUES "
                                "(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
                                -1, &st, nullptr) == SQLITE_OK);
  sqlite3_bind_text(st, 1, kId.tenant.data(), static_cast<int>(kId.tenant.size()), SQLITE_STATIC);
  sqlite3_bind_text(st, 2, kId.key.data(), static_cast<int>(kId.key.size()), SQLITE_STATIC);
  for (int c = 0; c < 12; ++c) {
    const int index = c + 3;
    if (static_cast<size_t>(c) >= fields.size()) {
      // Missing columns: a plausible default, so short inputs still insert.
      if (c >= 4 && c <= 8)
        sqlite3_bind_int64(st, index, 0);
      else if (c == 9 || c == 10)
        sqlite3_bind_null(st, index);
      else
        sqlite3_bind_text(st, index, "", 0, SQLITE_STATIC);
      continue;
    }
    const Field& f = fields[c];
    const int n = static_cast<int>(f.bytes.size());
    switch (f.tag) {
      case 'N':
        sqlite3_bind_null(st, index);
        break;
      case 'I':
        sqlite3_bind_int64(st, index, f.Int());
        break;
      case 'R':
        sqlite3_bind_double(st, index, static_cast<double>(f.Int()) + 0.5);
        break;
      case 'B':
        sqlite3_bind_blob(st, index, f.bytes.data(), n, SQLITE_STATIC);
        break;
      default:
        sqlite3_bind_text(st, index, f.bytes.data(), n, SQLITE_STATIC);
        break;
    }
  }
  const int rc = sqlite3_step(st);
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) return;  // the STRICT schema refused the values

  const auto record = idem::sqlite::ReadRecord(conn, kId);
  if (!record) {
    CheckDataLoss(record.error());
    return;
  }
  FUZZ_CHECK(record->has_value());
  const idem::Record& r = **record;
  FUZZ_CHECK_EQ(idem::RecordStateName(r.state),
                fields.empty() ? std::string() : std::string(fields[0].bytes));
  // Written back and read again, it is the same record.
  FUZZ_CHECK(idem::sqlite::WriteRecord(conn, r).has_value());
  const auto again = idem::sqlite::ReadRecord(conn, kId);
  FUZZ_CHECK(again.has_value() && again->has_value());
  SameRecord(r, **again);
}

// --- HTTP outcome bodies ----------------------------------------------------------------------

// The reverse proxy's stored answer (src/fronts/http_proxy/stored_response.h), the outcome
// body of its records, from any bytes: kDataLoss or an answer that encodes
// and decodes to itself.
void FuzzStoredResponse(std::string_view bytes) {
  const auto decoded = idem::proxy::DecodeStoredResponse(bytes);
  if (!decoded) {
    CheckDataLoss(decoded.error());
    return;
  }
  FUZZ_CHECK(decoded->status >= 100 && decoded->status <= 999);
  const auto again = idem::proxy::DecodeStoredResponse(idem::proxy::EncodeStoredResponse(*decoded));
  FUZZ_CHECK(again.has_value());
  FUZZ_CHECK_EQ(again->status, decoded->status);
  FUZZ_CHECK_EQ(again->body, decoded->body);
  FUZZ_CHECK_EQ(again->headers.size(), decoded->headers.size());
  for (size_t i = 0; i < decoded->headers.size(); ++i) {
    FUZZ_CHECK_EQ(again->headers[i].name, decoded->headers[i].name);
    FUZZ_CHECK_EQ(again->headers[i].value, decoded->headers[i].value);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const char store = static_cast<char>(data[0]);
  if (store == 'h') {
    FuzzStoredResponse(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
    return 0;
  }
  const auto fields =
      SplitFields(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  switch (store == 'r' || store == 'p' || store == 's' ? store : "rps"[data[0] % 3]) {
    case 'r':
      FuzzRedis(fields);
      break;
    case 'p':
      FuzzPostgres(fields);
      break;
    default:
      FuzzSqlite(fields);
      break;
  }
  return 0;
}

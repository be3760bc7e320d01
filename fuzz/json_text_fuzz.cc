// The in-place JSON edits of src/json/json_text.h on arbitrary text. Input:
// "<text>\0<name>\0<value>" (JSON never holds a raw NUL); a missing name is
// "_meta", a missing or unparsable value is {"k":1}.
//  - on any text, nothing reads out of bounds and errors are kInvalidArgument;
//  - on a JSON object Boost.JSON accepts: ObjectMembers lists its members
//    with byte-exact value spans; SetMember / RemoveMember give valid JSON
//    with that one member set / gone and every other member unchanged, or
//    refuse a duplicated name;
//  - on a JSON array: ArrayElements lists its elements; AppendElement gives
//    the array plus one element;
//  - Quote(s) of UTF-8 parses back to s;
//  - Validate accepts exactly what Boost.JSON parses; a View of any text
//    reads nothing out of bounds, and on an object finds a member sent once
//    with its exact value, and a member sent twice as ambiguous.
#include <boost/json.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "json/json_text.h"

namespace {

namespace jt = idem::json_text;
namespace json = boost::json;

std::optional<json::value> Parse(std::string_view text) {
  json::parse_options options;
  options.max_depth = 4096;
  boost::system::error_code ec;
  json::value v = json::parse(text, ec, {}, options);
  if (ec) return std::nullopt;
  return v;
}

// Boost.JSON's value equality, but a NaN equals a NaN: Boost.JSON 1.81 reads
// a zero with a huge exponent ("0e400") as 0 * inf = NaN, and the same bytes
// must compare equal wherever they are parsed
// (fuzz/regressions/json_text/zero-with-a-huge-exponent).
bool Same(const json::value& a, const json::value& b) {
  if (a.is_double() && b.is_double() && std::isnan(a.get_double())) {
    return std::isnan(b.get_double());
  }
  if (a.is_array() && b.is_array()) {
    const json::array& x = a.get_array();
    const json::array& y = b.get_array();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i) {
      if (!Same(x[i], y[i])) return false;
    }
    return true;
  }
  if (a.is_object() && b.is_object()) {
    const json::object& x = a.get_object();
    const json::object& y = b.get_object();
    if (x.size() != y.size()) return false;
    for (const auto& [k, v] : x) {
      const json::value* w = y.if_contains(k);
      if (w == nullptr || !Same(v, *w)) return false;
    }
    return true;
  }
  return a == b;
}

template <typename T>
void CheckError(const idem::Result<T>& r) {
  if (!r) {
    FUZZ_CHECK(r.error().code == idem::ErrorCode::kInvalidArgument);
    FUZZ_CHECK(!r.error().message.empty());
  }
}

// Every member of `before` but `name` is in `after`, unchanged.
void CheckOthersKept(const json::object& before, const json::object& after, std::string_view name) {
  for (const auto& [k, v] : before) {
    if (k == name) continue;
    FUZZ_CHECK(after.contains(k));
    FUZZ_CHECK(Same(after.at(k), v));
  }
}

void CheckObject(std::string_view text, const json::object& doc, std::string_view name,
                 std::string_view value, const json::value& value_json, bool name_is_utf8) {
  auto members = jt::ObjectMembers(text);
  FUZZ_CHECK(members.has_value());
  std::map<std::string, int> count;
  for (const auto& m : *members) ++count[m.name];
  FUZZ_CHECK_EQ(count.size(), doc.size());
  for (const auto& m : *members) {
    FUZZ_CHECK(doc.contains(m.name));
    const auto key = Parse(m.key.In(text));
    FUZZ_CHECK(key.has_value() && key->is_string() && key->get_string() == m.name);
    const auto v = Parse(m.value.In(text));
    FUZZ_CHECK(v.has_value());
    if (count[m.name] == 1) FUZZ_CHECK(Same(*v, doc.at(m.name)));
  }
  const bool duplicated = count.contains(std::string(name)) && count[std::string(name)] > 1;

  const jt::View member = jt::View(text)[name];
  FUZZ_CHECK_EQ(member.ambiguous(), duplicated);
  FUZZ_CHECK_EQ(member.present(), count.contains(std::string(name)) && !duplicated);
  if (member.present()) {
    const auto v = Parse(member.text());
    FUZZ_CHECK(v.has_value() && Same(*v, doc.at(name)));
    if (v->is_string()) FUZZ_CHECK(member.string() == std::string(v->get_string()));
    if (v->is_bool()) FUZZ_CHECK(member.boolean() == v->get_bool());
    if (auto i = member.int64()) FUZZ_CHECK(v->is_int64() && v->get_int64() == *i);
  }

  auto set = jt::SetMember(text, name, value);
  CheckError(set);
  FUZZ_CHECK_EQ(set.has_value(), !duplicated);
  if (set && name_is_utf8) {
    const auto after = Parse(*set);
    FUZZ_CHECK(after.has_value() && after->is_object());
    FUZZ_CHECK(after->get_object().contains(name));
    FUZZ_CHECK(Same(after->get_object().at(name), value_json));
    if (count.size() == members->size()) {
      CheckOthersKept(doc, after->get_object(), name);
      FUZZ_CHECK_EQ(after->get_object().size(), doc.size() + (doc.contains(name) ? 0 : 1));
    }
  }

  auto removed = jt::RemoveMember(text, name);
  CheckError(removed);
  FUZZ_CHECK_EQ(removed.has_value(), !duplicated);
  if (removed) {
    const auto after = Parse(*removed);
    FUZZ_CHECK(after.has_value() && after->is_object());
    FUZZ_CHECK(!after->get_object().contains(name));
    if (count.size() == members->size()) {
      CheckOthersKept(doc, after->get_object(), name);
      FUZZ_CHECK_EQ(after->get_object().size(), doc.size() - (doc.contains(name) ? 1 : 0));
    }
  }
}

void CheckArray(std::string_view text, const json::array& doc, std::string_view value,
                const json::value& value_json) {
  auto elements = jt::ArrayElements(text);
  FUZZ_CHECK(elements.has_value());
  FUZZ_CHECK_EQ(elements->size(), doc.size());
  for (size_t i = 0; i < doc.size(); ++i) {
    const auto v = Parse((*elements)[i].In(text));
    FUZZ_CHECK(v.has_value() && Same(*v, doc[i]));
  }
  auto appended = jt::AppendElement(text, value);
  FUZZ_CHECK(appended.has_value());
  const auto after = Parse(*appended);
  FUZZ_CHECK(after.has_value() && after->is_array());
  FUZZ_CHECK_EQ(after->get_array().size(), doc.size() + 1);
  for (size_t i = 0; i < doc.size(); ++i) FUZZ_CHECK(Same(after->get_array()[i], doc[i]));
  FUZZ_CHECK(Same(after->get_array().back(), value_json));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  auto take = [&rest]() {
    const size_t nul = rest.find('\0');
    std::string_view part = rest.substr(0, nul);
    rest = nul == std::string_view::npos ? std::string_view() : rest.substr(nul + 1);
    return part;
  };
  const std::string_view text = take();
  const bool has_name = !rest.empty();
  std::string_view name = take();
  if (!has_name) name = "_meta";
  std::string_view value = rest;
  auto value_json = Parse(value);
  if (!value_json) {
    value = R"({"k":1})";
    value_json = Parse(value);
  }

  // Quote: valid JSON for any bytes (a byte that is not UTF-8 becomes U+FFFD), and the
  // name itself for a UTF-8 name. Boost.JSON's own literal of the name parses exactly when
  // the name is UTF-8.
  const std::string quoted = jt::Quote(name);
  const auto unquoted = Parse(quoted);
  FUZZ_CHECK(unquoted.has_value() && unquoted->is_string());
  const bool name_is_utf8 =
      Parse(boost::json::serialize(boost::json::string_view(name))).has_value();
  if (name_is_utf8) FUZZ_CHECK(unquoted->get_string() == name);

  // Anything at all: errors, never out-of-bounds reads.
  const bool is_object = jt::IsObject(text);
  const bool is_array = jt::IsArray(text);
  FUZZ_CHECK(!(is_object && is_array));
  CheckError(jt::ObjectMembers(text));
  CheckError(jt::ArrayElements(text));
  CheckError(jt::SetMember(text, name, value));
  CheckError(jt::RemoveMember(text, name));
  CheckError(jt::AppendElement(text, value));

  const jt::View view(text);
  (void)view[name].string();
  (void)view[name].int64();
  (void)view.Elements();

  const auto doc = Parse(text);
  FUZZ_CHECK_EQ(jt::Validate(text, 4096).has_value(), doc.has_value());
  if (!doc) return 0;
  if (doc->is_object()) {
    CheckObject(text, doc->get_object(), name, value, *value_json, name_is_utf8);
  } else if (doc->is_array()) {
    CheckArray(text, doc->get_array(), value, *value_json);
  }
  return 0;
}

// Byte-exact views into JSON text, and edits that change only what they must.
//
// The proxy must forward what it does not change byte for byte, and what it
// does change (a tools/call with the key added to _meta, a replayed result
// with a note appended) without a parse-and-print round trip: Boost.JSON
// 1.81 holds numbers as int64/uint64/double, so re-serialising would round an
// argument like 123456789012345678901234 and send the tool a different
// number than the one the ledger fingerprinted. Reading is done with
// Boost.JSON; these functions locate members and elements in the original
// bytes and splice new JSON text into them.
//
// They expect text a JSON parser already accepted (or that this code built):
// nested values are skipped by their bracket and string structure, not
// validated again. On anything malformed they return kInvalidArgument, never
// read out of bounds. Pure functions, no I/O, safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/error.h"

namespace idem::json_text {

// A half-open byte range [begin, end) into a text.
struct Span {
  size_t begin = 0;
  size_t end = 0;
  std::string_view In(std::string_view text) const { return text.substr(begin, end - begin); }
};

// One member of an object.
struct Member {
  std::string name;  // unescaped
  Span key;          // the quoted name, quotes included
  Span value;        // the value, without surrounding whitespace
};

// The members of `object`, which must be exactly one JSON object (whitespace
// around it allowed), in text order. Duplicates are all listed.
Result<std::vector<Member>> ObjectMembers(std::string_view object);

// The elements of `array`, which must be exactly one JSON array.
Result<std::vector<Span>> ArrayElements(std::string_view array);

// Checks that `text` is exactly one JSON value (RFC 8259: UTF-8, no trailing
// data) nested at most `max_depth` deep, building nothing. kInvalidArgument,
// or kResourceExhausted past the depth, with DescribeJsonError's phrase
// ("not valid JSON at byte 61: …", "nested deeper than 64 levels"). What
// the fronts run once on each message before they read it through View.
Result<void> Validate(std::string_view text, size_t max_depth);

// A read-only view of one JSON value in text that a parser accepted (or
// that Validate did): a member or an element is found by scanning when it is
// asked for, and nothing is copied until a string is read. The fronts read
// a message through it (one parse per message, docs/DESIGN.md §6.1): no
// tree is built for the bytes nobody reads, such as a tool's arguments,
// which the canonicalizer parses itself.
//
// A member that appears more than once is `ambiguous()` and not present:
// parsers disagree about which copy wins, so nobody acts on either. The
// view holds a string_view: the text must outlive it. Safe from any thread.
class View {
 public:
  View() = default;  // absent
  // `text`: one JSON value, whitespace around it allowed.
  explicit View(std::string_view text);

  bool present() const { return present_; }
  bool ambiguous() const { return ambiguous_; }
  // The value's bytes, without surrounding whitespace; empty if absent.
  std::string_view text() const { return text_; }

  bool is_object() const { return First() == '{'; }
  bool is_array() const { return First() == '['; }
  bool is_string() const { return First() == '"'; }
  bool is_null() const { return text_ == "null"; }
  bool is_bool() const { return text_ == "true" || text_ == "false"; }
  bool is_number() const;
  // "an object", "a string", "null", …: what the value is, for messages.
  const char* KindName() const;

  // The member `name` (compared after unescaping) of an object; absent if
  // this is not an object or has no such member.
  View operator[](std::string_view name) const;
  // The elements of an array, in order; empty if this is not an array.
  std::vector<View> Elements() const;

  // The value read as that type; nullopt if it is another type.
  std::optional<std::string> string() const;  // unescaped
  std::optional<bool> boolean() const;
  // An integer literal that fits an int64 ("7", "-32602"); nullopt for a
  // fraction or exponent ("1.0", "1e3") and anything out of range.
  std::optional<int64_t> int64() const;

 private:
  char First() const { return text_.empty() ? '\0' : text_.front(); }
  static View Ambiguous();

  std::string_view text_;
  bool present_ = false;
  bool ambiguous_ = false;
};

// The one member called `name`: nullptr if absent. kInvalidArgument if the
// object has it more than once: parsers disagree about which copy wins, so
// acting on one while a peer reads the other is refused.
Result<const Member*> FindMember(const std::vector<Member>& members, std::string_view name);

// True if `value` (a JSON value's text) is an object / array / string.
bool IsObject(std::string_view value);
bool IsArray(std::string_view value);

// `object` with member `name` set to the JSON text `value`: replaced in place
// when present, else appended after the last member. Every other byte is kept.
// kInvalidArgument if `object` is not an object or has `name` twice.
Result<std::string> SetMember(std::string_view object, std::string_view name,
                              std::string_view value);

// SetMember for an `object` whose members were already found: `members` is
// ObjectMembers(object), which saves scanning the object again.
Result<std::string> SetMember(std::string_view object, const std::vector<Member>& members,
                              std::string_view name, std::string_view value);

// `object` without member `name` (unchanged if absent), with its separating
// comma. kInvalidArgument as SetMember.
Result<std::string> RemoveMember(std::string_view object, std::string_view name);

// `array` with the JSON text `element` appended as its last element.
Result<std::string> AppendElement(std::string_view array, std::string_view element);

// `s` as a JSON string literal, quotes included: the one way idemgate quotes
// a string into JSON text. Escapes are RFC 8785's (\" \\ \b \f \n \r \t,
// other controls as \u00xx, everything else raw), and a byte that is not
// part of well-formed UTF-8 becomes U+FFFD, so the result is always valid
// JSON whatever `s` holds (a header, a corrupt row, a peer's message).
std::string Quote(std::string_view s);
// The same, appended to `out`.
void AppendQuoted(std::string& out, std::string_view s);

}  // namespace idem::json_text

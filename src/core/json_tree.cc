#include "core/json_tree.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/json_escape.h"
#include "core/json_number.h"
#include "core/utf8.h"

namespace idem::json {
namespace {

// Offsets in a Node are 32-bit, and number text can grow up to ~9x its literal in scratch
// (a 5-byte "1e20," becomes 21 bytes), so inputs past this are refused whatever max_bytes
// says. Far beyond any tool-call argument object.
constexpr size_t kMaxSupportedBytes = size_t{256} << 20;

// The longest plain integer literal whose canonical form is the literal itself: every
// integer of up to 15 digits is a double exactly and its shortest form, and in exact mode
// every integer below 1e21 is written out in full.
constexpr size_t kPlainIntDigits = 15;
constexpr size_t kPlainIntDigitsExact = 21;

// Equality of member names, inline: most neighbours differ in length or first byte.
bool SameText(std::string_view a, std::string_view b) {
  return a.size() == b.size() && (a.empty() || (a[0] == b[0] && a == b));
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

bool IsWhitespace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// A member name or other input text shown in a message: quoted, escaped, shortened.
std::string Quote(std::string_view text) {
  constexpr size_t kMax = 64;
  std::string out = "\"";
  size_t n = text.size();
  if (n > kMax) {
    n = kMax;
    while (n > 0 && utf8::IsContinuation(static_cast<unsigned char>(text[n]))) --n;
  }
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += n < text.size() ? "\"..." : "\"";
  return out;
}

// How an unexpected input byte is shown: 'x' if printable ASCII, else its hex value.
std::string Describe(unsigned char c) {
  char buf[16];
  if (c >= 0x20 && c < 0x7F) {
    std::snprintf(buf, sizeof(buf), "'%c'", c);
  } else {
    std::snprintf(buf, sizeof(buf), "byte 0x%02X", c);
  }
  return buf;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The four hex digits at p (at least 4 bytes available), or -1.
int32_t Hex4(const char* p) {
  int32_t v = 0;
  for (int i = 0; i < 4; ++i) {
    const int h = HexValue(p[i]);
    if (h < 0) return -1;
    v = v << 4 | h;
  }
  return v;
}

}  // namespace

// Fills a Tree from bytes; lives for one Tree::Parse call. The cursor is passed and returned
// by value (nullptr after an error) rather than kept in a member: stores into scratch are char
// stores, which may alias any member, so a member cursor would be reloaded after each one.
class Parser {
 public:
  Parser(Tree& tree, std::string_view input, const CanonOptions& options)
      : t_(tree), options_(options), begin_(input.data()), end_(input.data() + input.size()) {}

  Result<void> Run();

 private:
  // Records a syntax error at `at`; returns nullptr so callers can `return Fail(...)`.
  const char* Fail(const char* at, std::string_view what) {
    code_ = ErrorCode::kInvalidArgument;
    message_ = "invalid JSON at byte " + std::to_string(at - begin_) + ": ";
    message_ += what;
    return nullptr;
  }
  const char* FailUnexpected(const char* at, std::string_view expected);
  const char* FailUtf8(const char* at, utf8::Problem problem);
  const char* FailNoncharacter(const char* at, uint32_t code_point);

  [[gnu::always_inline]] const char* SkipWhitespace(const char* p) const {
    while (p < end_ && IsWhitespace(*p)) ++p;
    return p;
  }

  uint32_t Offset(const char* p) const { return static_cast<uint32_t>(p - begin_); }

  [[gnu::always_inline]] uint32_t AddNode(Kind kind, const char* at) {
    const auto i = static_cast<uint32_t>(t_.nodes_.size());
    // Filled in place: copying in a temporary makes the CPU reload freshly stored narrow
    // fields as one wide value, a store-forwarding stall on every node.
    Node& node = t_.nodes_.Append();
    node.kind = kind;
    node.end = i + 1;
    node.pos = Offset(at);
    return i;
  }

  // Unescaped names and canonical string values never outgrow their input bytes, so one
  // reservation at the first escape covers every string; only numbers can add more.
  void ReserveScratch() {
    const size_t want = static_cast<size_t>(end_ - begin_) + 64;
    if (t_.scratch_.capacity() < want) t_.scratch_.reserve(want);
  }

  bool OpenContainer(Kind kind, const char* at);
  void CloseArray();
  bool CloseObject();
  const char* ParseName(const char* p);
  const char* ParseString(const char* p, Kind kind);
  const char* ParseEscape(const char* p, bool canonical);
  const char* ParseNumber(const char* p);
  const char* ParseLiteral(const char* p);

  Tree& t_;
  const CanonOptions& options_;
  const char* const begin_;
  const char* const end_;
  std::vector<uint32_t> open_;  // the containers enclosing the cursor, outermost first
  struct Name {
    std::string_view text;
    uint32_t node;
  };
  std::vector<Name> names_;  // CloseObject's working space, kept to reuse its allocation
  ErrorCode code_ = ErrorCode::kInvalidArgument;
  std::string message_;
};

Result<void> Parser::Run() {
  const size_t size = static_cast<size_t>(end_ - begin_);
  const size_t limit = std::min(options_.max_bytes, kMaxSupportedBytes);
  if (size > limit) {
    return MakeError(ErrorCode::kResourceExhausted,
                     "JSON input is " + std::to_string(size) + " bytes, over the limit of " +
                         std::to_string(limit) +
                         " bytes; send smaller arguments or raise max_bytes" +
                         (limit < options_.max_bytes ? " (the canonicalizer's ceiling)" : ""));
  }
  const auto failed = [this] { return MakeError(code_, std::move(message_)); };
  const char* p = begin_;
  // Leading byte order mark: RFC 8259 §8.1 lets a parser ignore it; I-JSON forbids it.
  if (size >= 3 && std::memcmp(p, "\xEF\xBB\xBF", 3) == 0) {
    if (options_.strict) {
      Fail(p, "leading byte order mark (U+FEFF) in strict profile; send UTF-8 without a BOM");
      return failed();
    }
    p += 3;
  }
  // Argument objects have about a node per 8 bytes and a member per 16; reserving that
  // avoids regrowth.
  t_.nodes_.reserve(size / 8 + 8);
  t_.member_order_.reserve(size / 16 + 8);
  open_.reserve(std::min<size_t>(options_.max_depth, 32));
  names_.reserve(16);
  p = SkipWhitespace(p);
  if (p == end_) {
    Fail(p, "empty input; send exactly one JSON value");
    return failed();
  }

  for (;;) {
    // Here p is at the start of a value, whitespace skipped.
    if (p == end_) {
      Fail(p, "unexpected end of input; expected a value");
      return failed();
    }
    switch (*p) {
      case '{':
        if (!OpenContainer(Kind::kObject, p)) return failed();
        p = SkipWhitespace(p + 1);
        if (p < end_ && *p == '}') {
          ++p;
          if (!CloseObject()) return failed();
          break;
        }
        p = ParseName(p);
        if (p == nullptr) return failed();
        continue;  // on to the first member's value
      case '[':
        if (!OpenContainer(Kind::kArray, p)) return failed();
        p = SkipWhitespace(p + 1);
        if (p < end_ && *p == ']') {
          ++p;
          CloseArray();
          break;
        }
        continue;  // on to the first element
      case '"':
        p = ParseString(p, Kind::kString);
        break;
      case '-':
      case '0':
      case '1':
      case '2':
      case '3':
      case '4':
      case '5':
      case '6':
      case '7':
      case '8':
      case '9':
        p = ParseNumber(p);
        break;
      default:
        p = ParseLiteral(p);
        break;
    }
    if (p == nullptr) return failed();

    // A value just ended: close every container it completes, then find where the next value
    // starts, or finish.
    for (;;) {
      p = SkipWhitespace(p);
      if (open_.empty()) {
        if (p == end_) return {};
        FailUnexpected(p, "the end of input after the JSON value; send exactly one JSON value");
        return failed();
      }
      const bool in_object = t_.nodes_[open_.back()].kind == Kind::kObject;
      if (p == end_) {
        Fail(p, in_object ? "unexpected end of input; the object is missing a '}'"
                          : "unexpected end of input; the array is missing a ']'");
        return failed();
      }
      if (*p == ',') {
        p = SkipWhitespace(p + 1);
        if (p < end_ && (*p == ']' || *p == '}')) {
          Fail(p, "trailing comma; remove the ',' before the closing bracket");
          return failed();
        }
        if (in_object) p = ParseName(p);
        if (p == nullptr) return failed();
        break;  // on to the next value
      }
      if (*p == (in_object ? '}' : ']')) {
        ++p;
        if (!in_object) {
          CloseArray();
        } else if (!CloseObject()) {
          return failed();
        }
        continue;
      }
      FailUnexpected(
          p, in_object ? "',' or '}' after an object member" : "',' or ']' after an array element");
      return failed();
    }
  }
}

const char* Parser::FailUnexpected(const char* at, std::string_view expected) {
  std::string what = "unexpected " + Describe(static_cast<unsigned char>(*at)) + "; expected ";
  what += expected;
  return Fail(at, what);
}

const char* Parser::FailUtf8(const char* at, utf8::Problem problem) {
  return Fail(at, std::string("invalid UTF-8 (") + utf8::ProblemName(problem) +
                      "); send the text as UTF-8");
}

const char* Parser::FailNoncharacter(const char* at, uint32_t code_point) {
  char what[96];
  std::snprintf(what, sizeof(what), "Unicode noncharacter U+%04X (strict profile)", code_point);
  return Fail(at, what);
}

bool Parser::OpenContainer(Kind kind, const char* at) {
  // Checked before descending, so a 10,000-deep input costs nothing but this message.
  if (open_.size() >= options_.max_depth) {
    Fail(at, "nesting deeper than " + std::to_string(options_.max_depth) +
                 " levels; flatten the arguments or raise max_depth");
    code_ = ErrorCode::kResourceExhausted;
    return false;
  }
  open_.push_back(AddNode(kind, at));
  t_.depth_ = std::max(t_.depth_, open_.size());
  return true;
}

void Parser::CloseArray() {
  t_.nodes_[open_.back()].end = static_cast<uint32_t>(t_.nodes_.size());
  open_.pop_back();
}

bool Parser::CloseObject() {
  const uint32_t object = open_.back();
  open_.pop_back();
  const auto end = static_cast<uint32_t>(t_.nodes_.size());
  Node& node = t_.nodes_[object];
  node.end = end;
  node.off = static_cast<uint32_t>(t_.member_order_.size());
  if (end - object <= 3) {  // {} or one member: nothing to order
    node.len = end - object == 3 ? 1 : 0;
    if (node.len == 1) t_.member_order_.push_back(object + 1);
    return true;
  }
  // Sorted as (name, node) pairs so comparisons touch no nodes; scratch does not move while
  // the names are in use.
  names_.clear();
  for (uint32_t name = object + 1; name < end; name = t_.nodes_[name + 1].end) {
    names_.push_back(Name{t_.Text(t_.nodes_[name]), name});
  }
  const auto less = [](const Name& a, const Name& b) {
    return utf8::CompareUtf16Order(a.text, b.text) < 0;
  };
  if (names_.size() <= 16) {
    // Argument objects are small: insertion sort without std::sort's setup.
    for (size_t i = 1; i < names_.size(); ++i) {
      const Name moving = names_[i];
      size_t j = i;
      for (; j > 0 && less(moving, names_[j - 1]); --j) names_[j] = names_[j - 1];
      names_[j] = moving;
    }
  } else {
    std::sort(names_.begin(), names_.end(), less);
  }
  node.len = static_cast<uint32_t>(names_.size());
  for (size_t i = 0; i < names_.size(); ++i) {
    // Equal names are now neighbours; blame the one that came second in the input.
    if (i > 0 && SameText(names_[i - 1].text, names_[i].text)) {
      const uint32_t later = std::max(names_[i - 1].node, names_[i].node);
      Fail(begin_ + t_.nodes_[later].pos,
           "duplicate member name " + Quote(names_[i].text) + "; send each member once");
      return false;
    }
    t_.member_order_.push_back(names_[i].node);
  }
  return true;
}

const char* Parser::ParseName(const char* p) {
  if (p == end_) return Fail(p, "unexpected end of input; expected a member name");
  if (*p != '"') return FailUnexpected(p, "a member name in double quotes");
  p = ParseString(p, Kind::kName);
  if (p == nullptr) return nullptr;
  p = SkipWhitespace(p);
  if (p == end_) return Fail(p, "unexpected end of input; expected ':' after the member name");
  if (*p != ':') return FailUnexpected(p, "':' after the member name");
  return SkipWhitespace(p + 1);
}

const char* Parser::ParseString(const char* p, Kind kind) {
  const char* const quote = p;
  const uint32_t index = AddNode(kind, quote);
  // A value is kept as canonical JSON text, quotes included; a name as its unescaped text.
  const bool canonical = kind == Kind::kString;
  std::string& scratch = t_.scratch_;
  const char* run = ++p;  // start of the input bytes not yet copied to scratch
  bool escaped = false;
  size_t start = 0;
  for (;;) {
    p = utf8::SkipPlainStringBytes(p, end_);
    if (p == end_) return Fail(quote, "unterminated string; add the closing '\"'");
    const auto c = static_cast<unsigned char>(*p);
    if (c == '"') {
      Node& node = t_.nodes_[index];
      if (escaped) {
        scratch.append(run, p);
        if (canonical) scratch += '"';
        node.in_scratch = true;
        node.off = static_cast<uint32_t>(start);
        node.len = static_cast<uint32_t>(scratch.size() - start);
      } else if (canonical) {
        node.off = Offset(quote);
        node.len = static_cast<uint32_t>(p + 1 - quote);
      } else {
        node.off = Offset(quote + 1);
        node.len = static_cast<uint32_t>(p - (quote + 1));
      }
      return p + 1;
    }
    if (c >= 0x80) {
      const utf8::Char ch = utf8::DecodeMultiByte(reinterpret_cast<const unsigned char*>(p),
                                                  reinterpret_cast<const unsigned char*>(end_));
      if (ch.problem != utf8::Problem::kNone) return FailUtf8(p, ch.problem);
      if (options_.strict && utf8::IsNoncharacter(ch.code_point)) {
        return FailNoncharacter(p, ch.code_point);
      }
      p += ch.length;
    } else if (c == '\\') {
      if (!escaped) {
        escaped = true;
        ReserveScratch();
        start = scratch.size();
        if (canonical) scratch += '"';
      }
      scratch.append(run, p);
      p = ParseEscape(p, canonical);
      if (p == nullptr) return nullptr;
      run = p;
    } else {
      char what[96];
      std::snprintf(what, sizeof(what),
                    "raw control character U+%04X in a string; write it as \\u%04x", c, c);
      return Fail(p, what);
    }
  }
}

const char* Parser::ParseEscape(const char* p, bool canonical) {
  const char* const at = p;
  if (end_ - p < 2) return Fail(at, "unterminated string; add the closing '\"'");
  uint32_t cp;
  switch (p[1]) {
    case '"':
    case '\\':
    case '/':
      cp = static_cast<unsigned char>(p[1]);
      break;
    case 'b':
      cp = '\b';
      break;
    case 'f':
      cp = '\f';
      break;
    case 'n':
      cp = '\n';
      break;
    case 'r':
      cp = '\r';
      break;
    case 't':
      cp = '\t';
      break;
    case 'u': {
      const int32_t unit = end_ - p >= 6 ? Hex4(p + 2) : -1;
      if (unit < 0) return Fail(at, "\\u escape needs exactly 4 hex digits, as in \\u00e9");
      cp = static_cast<uint32_t>(unit);
      if (cp >= 0xDC00 && cp <= 0xDFFF) {
        return Fail(at,
                    "lone low surrogate in \\u escape; a \\uDC00-\\uDFFF escape must follow a "
                    "\\uD800-\\uDBFF one");
      }
      if (cp >= 0xD800 && cp <= 0xDBFF) {
        const char* q = p + 6;
        const int32_t low = end_ - q >= 6 && q[0] == '\\' && q[1] == 'u' ? Hex4(q + 2) : -1;
        if (low < 0xDC00 || low > 0xDFFF) {
          return Fail(at,
                      "lone high surrogate in \\u escape; a \\uD800-\\uDBFF escape must be "
                      "followed by a \\uDC00-\\uDFFF one");
        }
        cp = 0x10000 + ((cp - 0xD800) << 10) + (static_cast<uint32_t>(low) - 0xDC00);
        p += 6;
      }
      if (options_.strict && utf8::IsNoncharacter(cp)) return FailNoncharacter(at, cp);
      p += 4;  // the 2 below make 6 for \uXXXX
      break;
    }
    default:
      return Fail(at, "invalid escape: backslash followed by " +
                          Describe(static_cast<unsigned char>(p[1])) +
                          "; JSON allows \\\" \\\\ \\/ \\b \\f \\n \\r \\t and \\uXXXX");
  }
  char buf[6];
  if (canonical && cp < 0x80 && NeedsEscape(static_cast<unsigned char>(cp))) {
    t_.scratch_.append(buf, CanonicalEscape(static_cast<unsigned char>(cp), buf));
  } else {
    t_.scratch_.append(buf, utf8::Encode(cp, buf));
  }
  return p + 2;
}

const char* Parser::ParseNumber(const char* p) {
  const char* const start = p;
  NumberLiteral lit;
  if (*p == '-') {
    lit.negative = true;
    ++p;
  }
  if (p == end_ || !IsDigit(*p)) {
    if (p < end_ && *p == 'I') {
      return Fail(start, "-Infinity is not a JSON number; send a finite number or a string");
    }
    return Fail(p, "expected a digit after '-'");
  }
  const char* int_start = p;
  if (*p == '0') {
    ++p;
    if (p < end_ && IsDigit(*p)) {
      return Fail(int_start, "number with a leading zero; write 5 or 0.5, never 05");
    }
  } else {
    while (p < end_ && IsDigit(*p)) ++p;
  }
  lit.int_digits = {int_start, p};
  bool plain = true;
  if (p < end_ && *p == '.') {
    plain = false;
    const char* frac_start = ++p;
    while (p < end_ && IsDigit(*p)) ++p;
    if (p == frac_start) return Fail(p, "expected a digit after the decimal point");
    lit.frac_digits = {frac_start, p};
  }
  if (p < end_ && (*p == 'e' || *p == 'E')) {
    plain = false;
    ++p;
    bool negative_exponent = false;
    if (p < end_ && (*p == '+' || *p == '-')) negative_exponent = *p++ == '-';
    const char* exp_start = p;
    int64_t e = 0;
    while (p < end_ && IsDigit(*p)) {
      e = e * 10 + (*p++ - '0');
      if (e > kExponentLimit) {
        e = kExponentLimit;
        lit.exponent_clamped = true;
      }
    }
    if (p == exp_start) return Fail(p, "expected a digit in the exponent");
    lit.exponent = negative_exponent ? -e : e;
  }
  lit.text = {start, p};

  const uint32_t index = AddNode(Kind::kNumber, start);
  if (plain &&
      lit.int_digits.size() <= (options_.exact_numbers ? kPlainIntDigitsExact : kPlainIntDigits)) {
    // Already canonical; "-0" is "0", which is the int digits alone.
    const std::string_view text = lit.int_digits == "0" ? lit.int_digits : lit.text;
    Node& node = t_.nodes_[index];
    node.off = Offset(text.data());
    node.len = static_cast<uint32_t>(text.size());
    return p;
  }
  ReserveScratch();
  std::string& scratch = t_.scratch_;
  const size_t offset = scratch.size();
  const NumberProblem problem =
      AppendCanonicalNumber(lit, options_.exact_numbers, options_.strict, scratch);
  if (problem != NumberProblem::kNone) {
    scratch.resize(offset);
    switch (problem) {
      case NumberProblem::kOverflow:
        return Fail(start, "number " + Quote(lit.text) +
                               " is beyond the range of a double; send it as a string");
      case NumberProblem::kUnderflow:
        return Fail(start, "number " + Quote(lit.text) +
                               " underflows to 0 as a double (strict profile); send 0 or a "
                               "string");
      default:
        return Fail(start, "number " + Quote(lit.text) +
                               " has an exponent too large to fingerprint exactly; send it as a "
                               "string");
    }
  }
  Node& node = t_.nodes_[index];
  node.in_scratch = true;
  node.off = static_cast<uint32_t>(offset);
  node.len = static_cast<uint32_t>(scratch.size() - offset);
  return p;
}

const char* Parser::ParseLiteral(const char* p) {
  const auto rest = static_cast<size_t>(end_ - p);
  const auto is = [&](std::string_view word) {
    return rest >= word.size() && std::memcmp(p, word.data(), word.size()) == 0;
  };
  Kind kind;
  size_t length;
  if (is("true")) {
    kind = Kind::kTrue;
    length = 4;
  } else if (is("false")) {
    kind = Kind::kFalse;
    length = 5;
  } else if (is("null")) {
    kind = Kind::kNull;
    length = 4;
  } else if (is("NaN") || is("Infinity")) {
    return Fail(p, "NaN and Infinity are not JSON numbers; send a finite number or a string");
  } else if (*p == 't' || *p == 'f' || *p == 'n') {
    return Fail(p, "invalid literal; the JSON literals are true, false and null (lowercase)");
  } else {
    return FailUnexpected(p, "a JSON value (object, array, string, number, true, false, null)");
  }
  AddNode(kind, p);
  return p + length;
}

Result<void> Tree::Parse(std::string_view input, const CanonOptions& options) {
  input_ = input;
  nodes_.clear();
  member_order_.clear();
  scratch_.clear();
  depth_ = 0;
  return Parser(*this, input, options).Run();
}

}  // namespace idem::json

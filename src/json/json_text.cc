#include "json/json_text.h"

#include <boost/json.hpp>
#include <boost/json/basic_parser_impl.hpp>
#include <charconv>
#include <cstring>
#include <vector>

#include "core/json_escape.h"
#include "core/utf8.h"
#include "json/json_errors.h"

namespace idem::json_text {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::unexpected<Error> Malformed(std::string_view what, size_t pos) {
  return MakeError(ErrorCode::kInvalidArgument,
                   "malformed JSON at byte " + std::to_string(pos) + ": " + std::string(what));
}

// A cursor over JSON text that skips values by their structure.
class Scanner {
 public:
  explicit Scanner(std::string_view text) : text_(text) {}

  size_t pos() const { return pos_; }
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }
  void Advance() { ++pos_; }

  void SkipSpace() {
    while (!AtEnd() && IsSpace(text_[pos_])) ++pos_;
  }

  // At '"': moves past the closing quote.
  Result<void> SkipString() {
    const size_t start = pos_;
    ++pos_;
    // memchr to each quote (string bytes are most of a message); a quote
    // after an odd run of backslashes is escaped.
    while (!AtEnd()) {
      const void* quote = std::memchr(text_.data() + pos_, '"', text_.size() - pos_);
      if (quote == nullptr) break;
      const size_t at = static_cast<size_t>(static_cast<const char*>(quote) - text_.data());
      size_t backslashes = 0;
      while (at - backslashes > start + 1 && text_[at - backslashes - 1] == '\\') ++backslashes;
      pos_ = at + 1;
      if (backslashes % 2 == 0) return {};
    }
    pos_ = text_.size();
    return Malformed("unterminated string", start);
  }

  // Moves past one value (after leading whitespace).
  Result<void> SkipValue() {
    SkipSpace();
    if (AtEnd()) return Malformed("expected a value", pos_);
    char c = text_[pos_];
    if (c == '"') return SkipString();
    if (c == '{' || c == '[') return SkipContainer();
    const size_t start = pos_;
    while (!AtEnd()) {
      char d = text_[pos_];
      bool literal = (d >= '0' && d <= '9') || (d >= 'a' && d <= 'z') || (d >= 'A' && d <= 'Z') ||
                     d == '+' || d == '-' || d == '.';
      if (!literal) break;
      ++pos_;
    }
    if (pos_ == start) return Malformed("unexpected character", pos_);
    return {};
  }

 private:
  // The closing brackets still due inside a container, innermost last: the
  // first 64 in place, deeper ones on the heap. Skipping a container then
  // allocates nothing at the depths messages have (it runs several times
  // per message: docs/DESIGN.md §6.1), and any depth stays safe.
  class Closers {
   public:
    void Push(char c) {
      if (size_ < kInline) {
        inline_[size_] = c;
      } else {
        spill_.push_back(c);
      }
      ++size_;
    }
    bool Empty() const { return size_ == 0; }
    char Back() const { return size_ <= kInline ? inline_[size_ - 1] : spill_.back(); }
    void Pop() {
      if (size_ > kInline) spill_.pop_back();
      --size_;
    }

   private:
    static constexpr size_t kInline = 64;
    char inline_[kInline];
    std::vector<char> spill_;
    size_t size_ = 0;
  };

  // Iterative, so any nesting depth is safe.
  Result<void> SkipContainer() {
    Closers open;
    const size_t start = pos_;
    while (!AtEnd()) {
      char c = text_[pos_];
      if (c == '"') {
        if (auto s = SkipString(); !s) return s;
        continue;
      }
      if (c == '{' || c == '[') {
        open.Push(c == '{' ? '}' : ']');
      } else if (c == '}' || c == ']') {
        if (open.Empty() || open.Back() != c) return Malformed("unbalanced brackets", pos_);
        open.Pop();
        if (open.Empty()) {
          ++pos_;
          return {};
        }
      }
      ++pos_;
    }
    return Malformed("unterminated object or array", start);
  }

  std::string_view text_;
  size_t pos_ = 0;
};

Result<std::string> Unescape(std::string_view quoted) {
  if (quoted.find('\\') == std::string_view::npos) {
    return std::string(quoted.substr(1, quoted.size() - 2));
  }
  boost::system::error_code ec;
  boost::json::value v = boost::json::parse(quoted, ec);
  if (ec || !v.is_string()) return Malformed("bad member name", 0);
  return std::string(v.get_string());
}

}  // namespace

bool IsObject(std::string_view value) {
  size_t i = 0;
  while (i < value.size() && IsSpace(value[i])) ++i;
  return i < value.size() && value[i] == '{';
}

bool IsArray(std::string_view value) {
  size_t i = 0;
  while (i < value.size() && IsSpace(value[i])) ++i;
  return i < value.size() && value[i] == '[';
}

Result<std::vector<Member>> ObjectMembers(std::string_view object) {
  Scanner s(object);
  s.SkipSpace();
  if (s.Peek() != '{') return Malformed("expected an object", s.pos());
  s.Advance();
  std::vector<Member> members;
  members.reserve(8);  // a JSON-RPC message has four or five
  s.SkipSpace();
  if (s.Peek() == '}') {
    s.Advance();
  } else {
    while (true) {
      s.SkipSpace();
      if (s.Peek() != '"') return Malformed("expected a member name", s.pos());
      Member m;
      m.key.begin = s.pos();
      if (auto r = s.SkipString(); !r) return std::unexpected(r.error());
      m.key.end = s.pos();
      auto name = Unescape(m.key.In(object));
      if (!name) return std::unexpected(name.error());
      m.name = std::move(*name);
      s.SkipSpace();
      if (s.Peek() != ':') return Malformed("expected ':'", s.pos());
      s.Advance();
      s.SkipSpace();
      m.value.begin = s.pos();
      if (auto r = s.SkipValue(); !r) return std::unexpected(r.error());
      m.value.end = s.pos();
      members.push_back(std::move(m));
      s.SkipSpace();
      if (s.Peek() == ',') {
        s.Advance();
        continue;
      }
      if (s.Peek() == '}') {
        s.Advance();
        break;
      }
      return Malformed("expected ',' or '}'", s.pos());
    }
  }
  s.SkipSpace();
  if (!s.AtEnd()) return Malformed("trailing data after the object", s.pos());
  return members;
}

Result<std::vector<Span>> ArrayElements(std::string_view array) {
  Scanner s(array);
  s.SkipSpace();
  if (s.Peek() != '[') return Malformed("expected an array", s.pos());
  s.Advance();
  std::vector<Span> elements;
  s.SkipSpace();
  if (s.Peek() == ']') {
    s.Advance();
  } else {
    while (true) {
      s.SkipSpace();
      Span e;
      e.begin = s.pos();
      if (auto r = s.SkipValue(); !r) return std::unexpected(r.error());
      e.end = s.pos();
      elements.push_back(e);
      s.SkipSpace();
      if (s.Peek() == ',') {
        s.Advance();
        continue;
      }
      if (s.Peek() == ']') {
        s.Advance();
        break;
      }
      return Malformed("expected ',' or ']'", s.pos());
    }
  }
  s.SkipSpace();
  if (!s.AtEnd()) return Malformed("trailing data after the array", s.pos());
  return elements;
}

Result<const Member*> FindMember(const std::vector<Member>& members, std::string_view name) {
  const Member* found = nullptr;
  for (const Member& m : members) {
    if (m.name != name) continue;
    if (found != nullptr) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "member \"" + std::string(name) + "\" appears more than once");
    }
    found = &m;
  }
  return found;
}

Result<std::string> SetMember(std::string_view object, std::string_view name,
                              std::string_view value) {
  auto members = ObjectMembers(object);
  if (!members) return std::unexpected(members.error());
  return SetMember(object, *members, name, value);
}

Result<std::string> SetMember(std::string_view object, const std::vector<Member>& members,
                              std::string_view name, std::string_view value) {
  auto found = FindMember(members, name);
  if (!found) return std::unexpected(found.error());
  std::string out;
  if (*found != nullptr) {
    const Span& v = (*found)->value;
    out.reserve(object.size() - (v.end - v.begin) + value.size());
    out.append(object.substr(0, v.begin));
    out.append(value);
    out.append(object.substr(v.end));
    return out;
  }
  size_t at;
  std::string insert;
  if (members.empty()) {
    at = object.find('{') + 1;
  } else {
    at = members.back().value.end;
    insert = ",";
  }
  insert += Quote(name);
  insert += ':';
  insert.append(value);
  out.reserve(object.size() + insert.size());
  out.append(object.substr(0, at));
  out.append(insert);
  out.append(object.substr(at));
  return out;
}

Result<std::string> RemoveMember(std::string_view object, std::string_view name) {
  auto members = ObjectMembers(object);
  if (!members) return std::unexpected(members.error());
  auto found = FindMember(*members, name);
  if (!found) return std::unexpected(found.error());
  if (*found == nullptr) return std::string(object);
  const size_t index = static_cast<size_t>(*found - members->data());
  size_t begin = (*found)->key.begin;
  size_t end = (*found)->value.end;
  if (index + 1 < members->size()) {
    end = (*members)[index + 1].key.begin;  // eats the comma after it
  } else if (index > 0) {
    begin = (*members)[index - 1].value.end;  // eats the comma before it
  }
  std::string out(object.substr(0, begin));
  out.append(object.substr(end));
  return out;
}

Result<std::string> AppendElement(std::string_view array, std::string_view element) {
  auto elements = ArrayElements(array);
  if (!elements) return std::unexpected(elements.error());
  size_t at;
  std::string insert;
  if (elements->empty()) {
    at = array.find('[') + 1;
  } else {
    at = elements->back().end;
    insert = ",";
  }
  insert.append(element);
  std::string out(array.substr(0, at));
  out.append(insert);
  out.append(array.substr(at));
  return out;
}

void AppendQuoted(std::string& out, std::string_view s) {
  out.push_back('"');
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  while (p < end) {
    // Printable ASCII other than '"' and '\\', most of any text, in one append.
    const auto* run = p;
    while (p < end && *p < 0x80 && !json::NeedsEscape(*p)) ++p;
    out.append(reinterpret_cast<const char*>(run), static_cast<size_t>(p - run));
    if (p == end) break;
    if (*p >= 0x80) {
      utf8::Char c = utf8::DecodeMultiByte(p, end);
      if (c.problem == utf8::Problem::kNone) {
        out.append(reinterpret_cast<const char*>(p), c.length);
        p += c.length;
      } else {
        out.append("\xEF\xBF\xBD");  // U+FFFD for a byte that is not UTF-8
        ++p;
      }
      continue;
    }
    char escaped[6];
    out.append(escaped, json::CanonicalEscape(*p, escaped));
    ++p;
  }
  out.push_back('"');
}

std::string Quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  AppendQuoted(out, s);
  return out;
}

namespace {

// A Boost.JSON parser handler that keeps nothing: the grammar, UTF-8 and
// depth checks without a tree.
struct NullHandler {
  using error_code = boost::system::error_code;
  using string_view = boost::json::string_view;
  static constexpr size_t max_object_size = size_t(-1);
  static constexpr size_t max_array_size = size_t(-1);
  static constexpr size_t max_key_size = size_t(-1);
  static constexpr size_t max_string_size = size_t(-1);
  bool on_document_begin(error_code&) { return true; }
  bool on_document_end(error_code&) { return true; }
  bool on_array_begin(error_code&) { return true; }
  bool on_array_end(size_t, error_code&) { return true; }
  bool on_object_begin(error_code&) { return true; }
  bool on_object_end(size_t, error_code&) { return true; }
  bool on_string_part(string_view, size_t, error_code&) { return true; }
  bool on_string(string_view, size_t, error_code&) { return true; }
  bool on_key_part(string_view, size_t, error_code&) { return true; }
  bool on_key(string_view, size_t, error_code&) { return true; }
  bool on_number_part(string_view, error_code&) { return true; }
  bool on_int64(int64_t, string_view, error_code&) { return true; }
  bool on_uint64(uint64_t, string_view, error_code&) { return true; }
  bool on_double(double, string_view, error_code&) { return true; }
  bool on_bool(bool, error_code&) { return true; }
  bool on_null(error_code&) { return true; }
  bool on_comment_part(string_view, error_code&) { return true; }
  bool on_comment(string_view, error_code&) { return true; }
};

// `quoted` (a string literal, quotes included) equals `name` once unescaped.
bool NameIs(std::string_view quoted, std::string_view name) {
  const std::string_view raw = quoted.substr(1, quoted.size() - 2);
  if (raw.find('\\') == std::string_view::npos) return raw == name;
  auto unescaped = Unescape(quoted);
  return unescaped && *unescaped == name;
}

std::string_view Trimmed(std::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

Result<void> Validate(std::string_view text, size_t max_depth) {
  boost::json::parse_options options;
  options.max_depth = max_depth;
  boost::json::basic_parser<NullHandler> parser(options);
  boost::system::error_code ec;
  const size_t used = parser.write_some(false, text.data(), text.size(), ec);
  if (!ec && used != text.size()) ec = boost::json::error::extra_data;
  if (!ec) return {};
  return MakeError(ec == boost::json::error::too_deep ? ErrorCode::kResourceExhausted
                                                      : ErrorCode::kInvalidArgument,
                   DescribeJsonError(text, ec, max_depth));
}

View::View(std::string_view text) : text_(Trimmed(text)), present_(!text_.empty()) {}

bool View::is_number() const {
  const char c = First();
  return c == '-' || (c >= '0' && c <= '9');
}

const char* View::KindName() const {
  switch (First()) {
    case '{':
      return "an object";
    case '[':
      return "an array";
    case '"':
      return "a string";
    case 't':
    case 'f':
      return "a boolean";
    case 'n':
      return "null";
    default:
      return "a number";
  }
}

View View::operator[](std::string_view name) const {
  View found;
  if (!is_object()) return found;
  Scanner s(text_);
  s.Advance();  // '{'
  while (true) {
    s.SkipSpace();
    if (s.Peek() != '"') return found;  // '}' (or malformed: nothing more to find)
    const size_t key = s.pos();
    if (!s.SkipString()) return found;
    const bool match = NameIs(text_.substr(key, s.pos() - key), name);
    s.SkipSpace();
    if (s.Peek() != ':') return found;
    s.Advance();
    s.SkipSpace();
    const size_t value = s.pos();
    if (!s.SkipValue()) return found;
    if (match) {
      if (found.present_ || found.ambiguous_) return View::Ambiguous();
      found = View(text_.substr(value, s.pos() - value));
    }
    s.SkipSpace();
    if (s.Peek() != ',') return found;
    s.Advance();
  }
}

std::vector<View> View::Elements() const {
  std::vector<View> out;
  if (!is_array()) return out;
  auto spans = ArrayElements(text_);
  if (!spans) return out;
  out.reserve(spans->size());
  for (const Span& e : *spans) out.emplace_back(e.In(text_));
  return out;
}

std::optional<std::string> View::string() const {
  if (!is_string() || text_.size() < 2) return std::nullopt;
  auto s = Unescape(text_);
  if (!s) return std::nullopt;
  return std::move(*s);
}

std::optional<bool> View::boolean() const {
  if (text_ == "true") return true;
  if (text_ == "false") return false;
  return std::nullopt;
}

std::optional<int64_t> View::int64() const {
  int64_t v = 0;
  const char* end = text_.data() + text_.size();
  auto [ptr, ec] = std::from_chars(text_.data(), end, v);
  if (ec != std::errc() || ptr != end || text_.empty()) return std::nullopt;
  return v;
}

View View::Ambiguous() {
  View v;
  v.ambiguous_ = true;
  return v;
}

}  // namespace idem::json_text

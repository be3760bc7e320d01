#include "idem/canonical_json.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/hex.h"
#include "core/json_escape.h"
#include "core/json_tree.h"
#include "core/utf8.h"

namespace idem {
namespace {

using json::Kind;
using json::Node;
using json::Tree;

constexpr size_t kSha256Bytes = 32;

// SHA-256 fetched once. With OpenSSL 3, EVP_sha256() makes every digest look the
// implementation up again in the provider, which costs as much as hashing a small
// argument object.
const EVP_MD* Sha256() {
  static const EVP_MD* const md = [] {
    const EVP_MD* fetched = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    return fetched != nullptr ? fetched : EVP_sha256();
  }();
  return md;
}

// Collects canonical output in a string.
class StringSink {
 public:
  explicit StringSink(std::string& out) : out_(out) {}
  void Append(char c) { out_ += c; }
  void Append(std::string_view s) { out_ += s; }

 private:
  std::string& out_;
};

// Hashes canonical output as it is written, so a 1 MiB document never exists twice in memory.
// Output that fits the buffer is hashed in one call.
class HashSink {
 public:
  HashSink() = default;
  HashSink(const HashSink&) = delete;
  HashSink& operator=(const HashSink&) = delete;
  ~HashSink() { EVP_MD_CTX_free(ctx_); }

  void Append(char c) {
    if (used_ == kBufferBytes) Spill({});
    buffer_[used_++] = c;
  }
  void Append(std::string_view s) {
    const size_t n = s.size();
    if (n > kBufferBytes - used_) {
      Spill(s);
      return;
    }
    char* to = buffer_ + used_;
    used_ += n;
    // Most pieces are short names, numbers and punctuation: fixed-size, overlapping copies
    // stay inline where a memcpy call would cost more than the copy.
    const char* from = s.data();
    if (n >= 8 && n <= 16) {
      std::memcpy(to, from, 8);
      std::memcpy(to + n - 8, from + n - 8, 8);
    } else if (n >= 4 && n < 8) {
      std::memcpy(to, from, 4);
      std::memcpy(to + n - 4, from + n - 4, 4);
    } else if (n < 4) {
      for (size_t i = 0; i < n; ++i) to[i] = from[i];
    } else {
      std::memcpy(to, from, n);
    }
  }

  // Returns the lowercase hex digest of everything appended, or kInternal if OpenSSL failed.
  Result<std::string> Finish() {
    unsigned char md[kSha256Bytes];
    unsigned int md_len = 0;
    bool ok;
    if (ctx_ == nullptr) {
      ok = EVP_Digest(buffer_, used_, md, &md_len, Sha256(), nullptr) == 1;
    } else {
      ok = ok_ && EVP_DigestUpdate(ctx_, buffer_, used_) == 1 &&
           EVP_DigestFinal_ex(ctx_, md, &md_len) == 1;
    }
    if (!ok || md_len != kSha256Bytes) {
      return MakeError(ErrorCode::kInternal, "SHA-256 failed inside OpenSSL");
    }
    return LowerHex(md, kSha256Bytes);
  }

 private:
  static constexpr size_t kBufferBytes = 16 * 1024;

  // Hashes the buffer, then keeps `s` in the buffer or, if it is big, hashes it directly.
  void Spill(std::string_view s) {
    if (ctx_ == nullptr) {
      ctx_ = EVP_MD_CTX_new();
      ok_ = ctx_ != nullptr && EVP_DigestInit_ex(ctx_, Sha256(), nullptr) == 1;
    }
    if (ok_) ok_ = EVP_DigestUpdate(ctx_, buffer_, used_) == 1;
    used_ = 0;
    if (s.size() >= kBufferBytes) {
      if (ok_) ok_ = EVP_DigestUpdate(ctx_, s.data(), s.size()) == 1;
    } else if (!s.empty()) {
      std::memcpy(buffer_, s.data(), s.size());
      used_ = s.size();
    }
  }

  EVP_MD_CTX* ctx_ = nullptr;
  bool ok_ = true;
  size_t used_ = 0;
  char buffer_[kBufferBytes];
};

// Writes an unescaped string as a JSON string with RFC 8785's minimal escapes.
template <typename Sink>
void EmitEscapedString(std::string_view text, Sink& out) {
  out.Append('"');
  size_t run = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (!json::NeedsEscape(c)) continue;
    out.Append(text.substr(run, i - run));
    run = i + 1;
    char escape[6];
    out.Append(std::string_view(escape, json::CanonicalEscape(c, escape)));
  }
  out.Append(text.substr(run));
  out.Append('"');
}

// Writes the canonical form of the subtree at `root`. Iterative, like the parser, so the
// depth the parser allowed costs heap, never stack.
template <typename Sink>
void EmitValue(const Tree& tree, uint32_t root, Sink& out) {
  struct Frame {
    uint32_t container;
    uint32_t next;  // array: node index of the next element; object: index into Members()
    uint32_t end;   // array: node index past the last element; object: member count
  };
  std::vector<Frame> open;
  open.reserve(tree.depth() + 1);

  // Writes a scalar, or opens a container and leaves it on `open`.
  const auto begin_value = [&](uint32_t index) {
    const Node& node = tree.node(index);
    switch (node.kind) {
      case Kind::kNull:
        out.Append("null");
        break;
      case Kind::kFalse:
        out.Append("false");
        break;
      case Kind::kTrue:
        out.Append("true");
        break;
      case Kind::kNumber:
      case Kind::kString:
        out.Append(tree.Text(node));
        break;
      case Kind::kName:  // never a value
        break;
      case Kind::kArray:
        out.Append('[');
        open.push_back(Frame{index, index + 1, node.end});
        break;
      case Kind::kObject:
        out.Append('{');
        open.push_back(Frame{index, 0, node.len});
        break;
    }
  };

  begin_value(root);
  while (!open.empty()) {
    Frame& frame = open.back();
    const Node& container = tree.node(frame.container);
    const bool is_object = container.kind == Kind::kObject;
    if (frame.next == frame.end) {
      out.Append(is_object ? '}' : ']');
      open.pop_back();
      continue;
    }
    const bool first = is_object ? frame.next == 0 : frame.next == frame.container + 1;
    if (!first) out.Append(',');
    uint32_t value;
    if (is_object) {
      const uint32_t name_index = tree.Members(container)[frame.next++];
      const Node& name = tree.node(name_index);
      if (name.in_scratch) {
        EmitEscapedString(tree.Text(name), out);
      } else {
        // Escape-free input text is canonical as it stands, between its input quotes.
        out.Append(std::string_view(tree.input().data() + name.off - 1, name.len + 2));
      }
      out.Append(':');
      value = name_index + 1;
    } else {
      value = frame.next;
      frame.next = tree.node(value).end;
    }
    begin_value(value);  // may grow `open`: `frame` is not used after this
  }
}

CanonOptions ForFingerprint(CanonOptions options) {
  options.exact_numbers = true;
  return options;
}

// One parsed RFC 6901 pointer: its reference tokens, unescaped.
Result<std::vector<std::string>> SplitPointer(std::string_view pointer) {
  std::vector<std::string> tokens;
  if (pointer.empty()) return tokens;  // the whole document
  if (pointer[0] != '/') {
    return MakeError(ErrorCode::kInvalidArgument,
                     "JSON Pointer \"" + std::string(pointer) +
                         "\" must start with '/' (RFC 6901), as in \"/email\"");
  }
  for (size_t i = 1;;) {
    const size_t slash = std::min(pointer.find('/', i), pointer.size());
    std::string token;
    for (size_t j = i; j < slash; ++j) {
      if (pointer[j] != '~') {
        token += pointer[j];
      } else if (j + 1 < slash && (pointer[j + 1] == '0' || pointer[j + 1] == '1')) {
        token += pointer[++j] == '0' ? '~' : '/';
      } else {
        return MakeError(ErrorCode::kInvalidArgument,
                         "JSON Pointer \"" + std::string(pointer) +
                             "\" has a '~' not followed by 0 or 1; write ~0 for '~' and ~1 "
                             "for '/' (RFC 6901)");
      }
    }
    tokens.push_back(std::move(token));
    if (slash == pointer.size()) return tokens;
    i = slash + 1;
  }
}

constexpr uint32_t kMissing = UINT32_MAX;

// The node a pointer refers to, or kMissing.
uint32_t Resolve(const Tree& tree, const std::vector<std::string>& tokens) {
  uint32_t at = 0;
  for (const std::string& token : tokens) {
    const Node& node = tree.node(at);
    if (node.kind == Kind::kObject) {
      const auto members = tree.Members(node);
      const auto it = std::find_if(members.begin(), members.end(), [&](uint32_t key) {
        return tree.Text(tree.node(key)) == token;
      });
      if (it == members.end()) return kMissing;
      at = *it + 1;
    } else if (node.kind == Kind::kArray) {
      // RFC 6901 array index: "0" or digits without a leading zero; "-" names the element
      // after the last, which never exists.
      if (token.empty() || token.size() > 10 || (token.size() > 1 && token[0] == '0') ||
          !std::all_of(token.begin(), token.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        return kMissing;
      }
      uint64_t index = std::stoull(token);
      uint32_t element = at + 1;
      while (element < node.end && index > 0) {
        element = tree.node(element).end;
        --index;
      }
      if (element >= node.end) return kMissing;
      at = element;
    } else {
      return kMissing;
    }
  }
  return at;
}

bool IsValidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  while (p < end) {
    if (*p < 0x80) {
      ++p;
      continue;
    }
    const utf8::Char c = utf8::DecodeMultiByte(p, end);
    if (c.problem != utf8::Problem::kNone) return false;
    p += c.length;
  }
  return true;
}

}  // namespace

Result<std::string> Canonicalize(std::string_view input, const CanonOptions& options) {
  Tree tree;
  if (auto parsed = tree.Parse(input, options); !parsed) {
    return std::unexpected(std::move(parsed.error()));
  }
  std::string out;
  out.reserve(input.size());
  StringSink sink(out);
  EmitValue(tree, 0, sink);
  return out;
}

Result<std::string> Fingerprint(std::string_view input, CanonOptions options) {
  Tree tree;
  if (auto parsed = tree.Parse(input, ForFingerprint(options)); !parsed) {
    return std::unexpected(std::move(parsed.error()));
  }
  HashSink sink;
  EmitValue(tree, 0, sink);
  return sink.Finish();
}

Result<std::string> FingerprintFields(std::string_view input,
                                      const std::vector<std::string>& pointers,
                                      CanonOptions options) {
  struct Field {
    std::string_view pointer;
    uint32_t node;
  };
  std::vector<Field> fields;
  fields.reserve(pointers.size());
  // Pointers are checked before the input, so a bad configuration is reported as such.
  std::vector<std::vector<std::string>> tokens;
  tokens.reserve(pointers.size());
  for (const std::string& pointer : pointers) {
    if (!IsValidUtf8(pointer)) {
      return MakeError(ErrorCode::kInvalidArgument, "JSON Pointer is not valid UTF-8");
    }
    auto split = SplitPointer(pointer);
    if (!split) return std::unexpected(std::move(split.error()));
    tokens.push_back(std::move(*split));
  }
  Tree tree;
  if (auto parsed = tree.Parse(input, ForFingerprint(options)); !parsed) {
    return std::unexpected(std::move(parsed.error()));
  }
  for (size_t i = 0; i < pointers.size(); ++i) {
    const uint32_t node = Resolve(tree, tokens[i]);
    if (node == kMissing) {
      // Absent is not null: every call without the field would share one key.
      return MakeError(ErrorCode::kInvalidArgument,
                       "the key field " + pointers[i] +
                           " is missing from the arguments; send it (null is a value), or key "
                           "the tool on fields every call has");
    }
    fields.push_back(Field{pointers[i], node});
  }
  // The selection is an object keyed by pointer: canonical member order, and a pointer listed
  // twice selects the same value twice, so it counts once.
  std::sort(fields.begin(), fields.end(), [](const Field& a, const Field& b) {
    return utf8::CompareUtf16Order(a.pointer, b.pointer) < 0;
  });
  fields.erase(std::unique(fields.begin(), fields.end(),
                           [](const Field& a, const Field& b) { return a.pointer == b.pointer; }),
               fields.end());
  HashSink sink;
  sink.Append('{');
  for (size_t i = 0; i < fields.size(); ++i) {
    if (i > 0) sink.Append(',');
    EmitEscapedString(fields[i].pointer, sink);
    sink.Append(':');
    EmitValue(tree, fields[i].node, sink);
  }
  sink.Append('}');
  return sink.Finish();
}

std::string Sha256Hex(std::string_view bytes) {
  unsigned char md[kSha256Bytes];
  unsigned int md_len = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), md, &md_len, Sha256(), nullptr) != 1 ||
      md_len != kSha256Bytes) {
    // Only an allocation failure inside OpenSSL gets here. There is no error channel, and
    // an empty or partial digest would make unrelated inputs share a key, which is worse
    // than stopping.
    std::abort();
  }
  return LowerHex(md, kSha256Bytes);
}

}  // namespace idem

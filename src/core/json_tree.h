// A validated JSON text as one flat array of nodes: the parser behind canonical_json.h.
// Internal to idem_core.
//
// One array of nodes in document order (a subtree is a contiguous range), text held as views
// into the input wherever it needs no rewriting, and everything else in one scratch string:
// a handful of allocations per document rather than one per value. The parser is iterative,
// so input depth costs heap, never stack.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/canonical_json.h"
#include "idem/error.h"

namespace idem::json {

enum class Kind : uint8_t { kNull, kFalse, kTrue, kNumber, kString, kArray, kObject, kName };

struct Node {
  Kind kind;
  // Text of kNumber, kString and kName nodes lives in the tree's scratch, not the input.
  bool in_scratch;
  uint32_t end;  // index one past the last node of this subtree
  // kNumber, kString: offset and length of the value's canonical text (a string's quotes
  //   included), ready to write.
  // kName (an object member's name): offset and length of the unescaped name, for ordering
  //   and lookup; when in_scratch it had escapes and needs escaping again on output,
  //   otherwise it is canonical as it stands, and the input quotes surround it.
  // kObject: first index into the member order and the member count. kArray: unused.
  uint32_t off;
  uint32_t len;
  uint32_t pos;  // byte offset of the node in the input, for error messages
};

// A growable array of nodes whose append inlines to a compare and a store. (GCC 12 keeps
// std::vector::emplace_back out of line here, and a call per node is a visible share of
// the parse.) Node is trivially copyable, so growing is a plain copy.
class NodeArray {
 public:
  size_t size() const { return size_; }
  Node& operator[](size_t i) { return data_[i]; }
  const Node& operator[](size_t i) const { return data_[i]; }
  void clear() { size_ = 0; }
  void reserve(size_t n) {
    if (n > capacity_) Reallocate(n);
  }
  // Appends a node with every field zero and returns it.
  Node& Append() {
    if (size_ == capacity_) [[unlikely]]
      Reallocate(capacity_ < 8 ? 16 : 2 * capacity_);
    Node& node = data_[size_++];
    node = Node{};
    return node;
  }

 private:
  void Reallocate(size_t capacity) {
    auto data = std::make_unique_for_overwrite<Node[]>(capacity);
    if (size_ > 0) std::memcpy(data.get(), data_.get(), size_ * sizeof(Node));
    data_ = std::move(data);
    capacity_ = capacity;
  }

  std::unique_ptr<Node[]> data_;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

// A parsed document. An object's members are laid out as a kName node then the value's
// subtree, in input order; Members() gives them in canonical order. Views returned stay valid
// while the tree and its input live. Not thread-safe; cheap to reuse.
class Tree {
 public:
  // Parses and validates `input` (which must outlive the tree). On error the tree is
  // unusable and the message names the problem and its byte offset.
  Result<void> Parse(std::string_view input, const CanonOptions& options);

  const Node& node(uint32_t i) const { return nodes_[i]; }
  std::string_view Text(const Node& n) const {
    return {(n.in_scratch ? scratch_.data() : input_.data()) + n.off, n.len};
  }
  // Name node indices of an object, sorted by UTF-16 code units of the unescaped names (the
  // value of the member named by node k is node k + 1). Names are unique.
  std::span<const uint32_t> Members(const Node& object) const {
    return {member_order_.data() + object.off, object.len};
  }
  // Deepest container nesting seen (0 for a scalar document).
  size_t depth() const { return depth_; }
  std::string_view input() const { return input_; }

 private:
  friend class Parser;

  std::string_view input_;
  NodeArray nodes_;
  std::vector<uint32_t> member_order_;
  std::string scratch_;
  size_t depth_ = 0;
};

}  // namespace idem::json

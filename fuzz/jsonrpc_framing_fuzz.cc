// The MCP stdio framing and JSON-RPC classification (src/fronts/mcp/json_rpc.h) on
// arbitrary byte streams:
//  - LineFramer gives the same frames however the stream is chunked, with a
//    small limit as with the default one;
//  - the frames are the stream's lines without one trailing CR, blank
//    lines skipped, one oversize frame per line over the limit, carrying
//    the id an IdSkeleton of the whole line finds (ModelFrames), which is
//    null or a string or a number;
//  - FrameLine(frame) framed again gives the frame back (CR/LF as spaces);
//  - ParseMessage refuses with kInvalidArgument (kResourceExhausted: too
//    deep) or classifies as the JSON says, and idemgate's own answers to a
//    request parse as responses with the same id (a refused one's: the id
//    RecoverIdText finds, a string or a number, else null);
//  - JsonRpcEnvelopeProblem accepts exactly what a plain model of JSON-RPC
//    2.0 as MCP uses it accepts.
//
// The stream is the whole input; the chunking and the small limit are drawn
// from a hash of it, so corpus files are plain newline-delimited JSON.
#include <algorithm>
#include <boost/json.hpp>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fronts/mcp/json_rpc.h"
#include "fuzz_check.h"

namespace {

using idem::mcp::LineFramer;
using idem::mcp::Message;

// splitmix64: the chunk sizes, from the input's hash.
uint64_t Next(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::vector<LineFramer::Frame> FrameWhole(std::string_view stream, size_t max) {
  LineFramer framer(max);
  auto out = framer.Feed(stream);
  for (auto& f : framer.Finish()) out.push_back(std::move(f));
  return out;
}

std::vector<LineFramer::Frame> FrameChunked(std::string_view stream, size_t max, uint64_t seed) {
  LineFramer framer(max);
  std::vector<LineFramer::Frame> out;
  while (!stream.empty()) {
    // Mostly small chunks (1..8 bytes), sometimes large ones.
    const uint64_t r = Next(seed);
    const size_t n =
        std::min<size_t>(stream.size(), (r & 3) == 0 ? 1 + (r >> 8) % 512 : 1 + (r >> 8) % 8);
    for (auto& f : framer.Feed(stream.substr(0, n))) out.push_back(std::move(f));
    stream.remove_prefix(n);
  }
  for (auto& f : framer.Finish()) out.push_back(std::move(f));
  return out;
}

void CheckSameFrames(const std::vector<LineFramer::Frame>& a,
                     const std::vector<LineFramer::Frame>& b) {
  FUZZ_CHECK_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    FUZZ_CHECK_EQ(a[i].oversize, b[i].oversize);
    FUZZ_CHECK_EQ(a[i].message, b[i].message);
    FUZZ_CHECK_EQ(a[i].id_text, b[i].id_text);
  }
}

bool IsBlank(std::string_view s) { return s.find_first_not_of(" \t\r") == std::string_view::npos; }

// The framing as documented: each line without one trailing CR; one
// oversize frame for a line longer than `max`, at its end; blank lines
// skipped.
std::vector<LineFramer::Frame> ModelFrames(std::string_view stream, size_t max) {
  std::vector<LineFramer::Frame> out;
  while (!stream.empty()) {
    const size_t nl = stream.find('\n');
    std::string_view line = stream.substr(0, nl);
    const std::string_view whole = line;
    if (line.ends_with('\r')) line.remove_suffix(1);
    if (line.size() > max) {
      idem::mcp::IdSkeleton skeleton;
      skeleton.Feed(whole);
      const std::string id = skeleton.IdText();
      if (id != "null") {
        boost::system::error_code ec;
        const boost::json::value v = boost::json::parse(id, ec);
        FUZZ_CHECK(!ec && (v.is_string() || v.is_number()));
      }
      out.push_back(LineFramer::Frame{{}, true, id});
    } else if (!IsBlank(line)) {
      out.push_back(LineFramer::Frame{std::string(line), false});
    }
    if (nl == std::string_view::npos) break;
    stream.remove_prefix(nl + 1);
  }
  return out;
}

// JSON-RPC 2.0 as MCP uses it, plainly: a request or notification has
// "jsonrpc": "2.0", a string "method", an object "params" if any, a string or
// number "id" if any; anything without "method" is a response if it has an
// "id" and a "result" or an "error"; and none of those members is sent twice
// (json_text::ObjectMembers lists duplicates; json_text_fuzz checks it).
void CheckEnvelope(std::string_view text, const boost::json::value& json) {
  const std::optional<std::string> problem =
      idem::mcp::JsonRpcEnvelopeProblem(idem::json_text::View(text));
  const boost::json::object* o = json.if_object();
  bool twice = false;
  if (o != nullptr) {
    auto members = idem::json_text::ObjectMembers(text);
    FUZZ_CHECK(members.has_value());
    std::map<std::string, int> count;
    for (const auto& m : *members) ++count[m.name];
    for (const char* name : {"jsonrpc", "method", "id", "params", "result", "error"}) {
      twice = twice || count[name] > 1;
    }
  }
  bool usable = false;
  if (twice) {
    usable = false;
  } else if (o != nullptr && !o->contains("method")) {
    usable = o->contains("id") && (o->contains("result") || o->contains("error"));
  } else if (o != nullptr) {
    const auto* version = o->if_contains("jsonrpc");
    const auto* id = o->if_contains("id");
    const auto* params = o->if_contains("params");
    usable = o->at("method").is_string() && version != nullptr && version->is_string() &&
             version->get_string() == "2.0" &&
             (id == nullptr || id->is_string() || id->is_number()) &&
             (params == nullptr || params->is_object());
  }
  FUZZ_CHECK_EQ(!problem.has_value(), usable);
  if (problem) FUZZ_CHECK(!problem->empty());
}

void CheckClassified(const std::string& text) {
  auto m = idem::mcp::ParseMessage(text);
  if (!m) {
    FUZZ_CHECK(m.error().code == idem::ErrorCode::kInvalidArgument ||
               m.error().code == idem::ErrorCode::kResourceExhausted);
    FUZZ_CHECK(!m.error().message.empty());
    // The parse-error answer is one valid JSON-RPC error, for the id that
    // could be found: a string or a number, else null.
    const std::string id = idem::mcp::RecoverIdText(text);
    if (id != "null") {
      boost::system::error_code ec;
      boost::json::value v = boost::json::parse(id, ec);
      FUZZ_CHECK(!ec && (v.is_string() || v.is_number()));
    }
    auto answer = idem::mcp::ParseMessage(idem::mcp::ParseErrorResponse(id, m.error().message));
    FUZZ_CHECK(answer.has_value());
    FUZZ_CHECK(answer->kind == Message::Kind::kError);
    FUZZ_CHECK_EQ(answer->id_text, id);
    return;
  }
  // The oracle's own tree (ParseMessage builds none).
  boost::json::parse_options options;
  options.max_depth = idem::mcp::kMaxMessageDepth;
  boost::system::error_code ec;
  const boost::json::value json = boost::json::parse(text, ec, {}, options);
  FUZZ_CHECK(!ec);
  CheckEnvelope(text, json);
  switch (m->kind) {
    case Message::Kind::kBatch:
      FUZZ_CHECK(json.is_array());
      return;
    case Message::Kind::kOther:
      if (json.is_object()) {
        const auto& obj = json.get_object();
        const auto* method = obj.if_contains("method");
        FUZZ_CHECK(method == nullptr || !method->is_string());
        if (obj.contains("id")) FUZZ_CHECK(!obj.contains("result") && !obj.contains("error"));
      } else {
        FUZZ_CHECK(!json.is_array());
      }
      return;
    case Message::Kind::kNotification:
    case Message::Kind::kRequest: {
      const auto& obj = json.get_object();
      FUZZ_CHECK(obj.contains("method") && obj.at("method").is_string());
      FUZZ_CHECK_EQ(m->method, std::string(obj.at("method").get_string()));
      FUZZ_CHECK_EQ(m->kind == Message::Kind::kRequest, obj.contains("id"));
      break;
    }
    case Message::Kind::kResult:
      FUZZ_CHECK(json.get_object().contains("result"));
      FUZZ_CHECK(json.get_object().contains("id"));
      break;
    case Message::Kind::kError:
      FUZZ_CHECK(json.get_object().contains("error"));
      FUZZ_CHECK(json.get_object().contains("id"));
      break;
  }
  if (m->kind == Message::Kind::kNotification) return;
  const auto& obj = json.get_object();
  FUZZ_CHECK_EQ(m->id_key, idem::mcp::IdKey(obj.at("id")));
  boost::json::parse_options deep;
  deep.max_depth = idem::mcp::kMaxMessageDepth;
  // The id text is the id's bytes: it reads back as the same id (compared by
  // IdKey, since Boost.JSON reads "0e400" as a NaN, which equals nothing).
  FUZZ_CHECK_EQ(idem::mcp::IdKey(boost::json::parse(m->id_text, {}, deep)), m->id_key);

  // Answers built from the id text carry the same id.
  auto error = idem::mcp::ParseMessage(
      idem::mcp::ErrorResponse(m->id_text, idem::mcp::kRpcInvalidRequest, text));
  FUZZ_CHECK(error.has_value());
  FUZZ_CHECK(error->kind == Message::Kind::kError);
  FUZZ_CHECK_EQ(error->id_key, m->id_key);
  auto result = idem::mcp::ParseMessage(idem::mcp::ResultResponse(m->id_text, "{}"));
  FUZZ_CHECK(result.has_value());
  FUZZ_CHECK(result->kind == Message::Kind::kResult);
  FUZZ_CHECK_EQ(result->id_key, m->id_key);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view stream(reinterpret_cast<const char*>(data), size);
  const uint64_t seed = std::hash<std::string_view>()(stream);

  const auto frames = FrameWhole(stream, idem::mcp::kDefaultMaxMessageBytes);
  CheckSameFrames(frames, ModelFrames(stream, idem::mcp::kDefaultMaxMessageBytes));
  CheckSameFrames(frames, FrameChunked(stream, idem::mcp::kDefaultMaxMessageBytes, seed));
  const size_t small = 1 + seed % 64;
  const auto small_frames = FrameWhole(stream, small);
  CheckSameFrames(small_frames, ModelFrames(stream, small));
  CheckSameFrames(small_frames, FrameChunked(stream, small, seed ^ 1));

  for (const auto& f : frames) {
    FUZZ_CHECK(!f.oversize);

    std::string expected = f.message;
    for (char& c : expected) {
      if (c == '\r') c = ' ';
    }
    const auto again = FrameWhole(idem::mcp::FrameLine(f.message), 1024);
    if (f.message.size() <= 1024) {
      FUZZ_CHECK_EQ(again.size(), size_t{1});
      FUZZ_CHECK_EQ(again[0].message, expected);
    }
    CheckClassified(f.message);
  }
  return 0;
}

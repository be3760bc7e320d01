// The event-stream parser of src/fronts/mcp/sse.h on arbitrary bytes:
//  - the events, last event id and retry are those of a plain transcription
//    of the WHATWG algorithm (Model below);
//  - they and the failure are the same however the stream is chunked, with
//    the default limit and with a small one;
//  - a failure is kResourceExhausted and sticks;
//  - FormatSseEvent(data, type, id) parses back to one event with that data
//    (line ends as LF), type and id.
// The stream is the whole input; for the format property the input is also
// read as "<data>\0<type>\0<id>". Chunking is drawn from a hash of the input.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.h"
#include "fronts/mcp/sse.h"

namespace {

using idem::mcp::SseEvent;
using idem::mcp::SseParser;

uint64_t Next(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct Parsed {
  std::vector<SseEvent> events;
  bool failed = false;
  std::string last_event_id;
  std::optional<std::chrono::milliseconds> retry;
};

// Feeds `stream` in chunks (all of it at once when seed is 0).
Parsed Parse(std::string_view stream, size_t max, uint64_t seed) {
  SseParser parser(max);
  Parsed p;
  while (!stream.empty()) {
    size_t n = stream.size();
    if (seed != 0) {
      const uint64_t r = Next(seed);
      n = std::min<size_t>(n, (r & 3) == 0 ? 1 + (r >> 8) % 256 : 1 + (r >> 8) % 4);
    }
    auto fed = parser.Feed(stream.substr(0, n), p.events);
    stream.remove_prefix(n);
    if (!fed) {
      FUZZ_CHECK(fed.error().code == idem::ErrorCode::kResourceExhausted);
      FUZZ_CHECK(!fed.error().message.empty());
      std::vector<SseEvent> more;
      FUZZ_CHECK(!parser.Feed("data: x\n\n", more).has_value());  // stays failed
      FUZZ_CHECK(more.empty());
      p.failed = true;
      break;
    }
  }
  p.last_event_id = parser.last_event_id();
  p.retry = parser.retry();
  return p;
}

void CheckSame(const Parsed& a, const Parsed& b) {
  FUZZ_CHECK_EQ(a.failed, b.failed);
  FUZZ_CHECK_EQ(a.events.size(), b.events.size());
  for (size_t i = 0; i < a.events.size(); ++i) {
    FUZZ_CHECK_EQ(a.events[i].type, b.events[i].type);
    FUZZ_CHECK_EQ(a.events[i].data, b.events[i].data);
    FUZZ_CHECK_EQ(a.events[i].id, b.events[i].id);
  }
  if (!a.failed) {
    FUZZ_CHECK_EQ(a.last_event_id, b.last_event_id);
    FUZZ_CHECK(a.retry == b.retry);
  }
}

bool HasLineEnd(std::string_view s) { return s.find_first_of("\r\n") != std::string_view::npos; }

std::string NormalizedLines(std::string_view data) {
  std::string out;
  for (size_t i = 0; i < data.size(); ++i) {
    if (data[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < data.size() && data[i + 1] == '\n') ++i;
    } else {
      out.push_back(data[i]);
    }
  }
  return out;
}

// The standard's algorithm, written as plainly as possible: the whole stream
// at once, a leading BOM dropped, split into lines at CRLF, CR or LF, the
// unterminated tail ignored.
Parsed Model(std::string_view stream) {
  Parsed p;
  if (stream.starts_with("\xEF\xBB\xBF")) stream.remove_prefix(3);
  std::string data, type;
  bool has_data = false;
  while (true) {
    const size_t end = stream.find_first_of("\r\n");
    if (end == std::string_view::npos) break;
    const std::string_view line = stream.substr(0, end);
    stream.remove_prefix(end + (stream.substr(end, 2) == "\r\n" ? 2 : 1));
    if (line.empty()) {
      if (has_data) {
        if (data.ends_with('\n')) data.pop_back();
        p.events.push_back(SseEvent{type, data, p.last_event_id});
      }
      data.clear();
      type.clear();
      has_data = false;
      continue;
    }
    if (line.front() == ':') continue;
    const size_t colon = line.find(':');
    const std::string_view field = line.substr(0, colon);
    std::string_view value = colon == std::string_view::npos ? "" : line.substr(colon + 1);
    if (value.starts_with(' ')) value.remove_prefix(1);
    if (field == "data") {
      data.append(value).push_back('\n');
      has_data = true;
    } else if (field == "event") {
      type = value;
    } else if (field == "id") {
      if (value.find('\0') == std::string_view::npos) p.last_event_id = value;
    } else if (field == "retry" && !value.empty() &&
               value.find_first_not_of("0123456789") == std::string_view::npos) {
      uint64_t ms = 0;
      if (std::from_chars(value.data(), value.data() + value.size(), ms).ec == std::errc()) {
        p.retry = std::chrono::milliseconds(ms);
      }
    }
  }
  return p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  const std::string_view stream(reinterpret_cast<const char*>(bytes), size);
  const uint64_t seed = std::hash<std::string_view>()(stream) | 1;

  const size_t big = size_t{64} << 20;
  const Parsed whole = Parse(stream, big, 0);
  CheckSame(whole, Parse(stream, big, seed));
  CheckSame(whole, Model(stream));
  const size_t small = 1 + seed % 48;
  CheckSame(Parse(stream, small, 0), Parse(stream, small, seed + 2));

  // Format, then parse.
  std::string_view rest = stream;
  auto take = [&rest]() {
    const size_t nul = rest.find('\0');
    std::string_view part = rest.substr(0, nul);
    rest = nul == std::string_view::npos ? std::string_view() : rest.substr(nul + 1);
    return part;
  };
  const std::string_view data = take();
  const std::string_view type = take();
  const std::string_view id = rest;
  if (HasLineEnd(type) || HasLineEnd(id) || id.find('\0') != std::string_view::npos) return 0;
  const std::string formatted = idem::mcp::FormatSseEvent(data, type, id);
  const Parsed p = Parse(formatted, big, 0);
  FUZZ_CHECK(!p.failed);
  FUZZ_CHECK_EQ(p.events.size(), size_t{1});
  FUZZ_CHECK_EQ(p.events[0].data, NormalizedLines(data));
  FUZZ_CHECK_EQ(p.events[0].type, std::string(type));
  FUZZ_CHECK_EQ(p.events[0].id, std::string(id));
  return 0;
}

// Server-Sent Events (WHATWG HTML §9.2, "text/event-stream"): the framing of
// the Streamable HTTP response streams. The parser does no I/O: bytes in,
// events out, in any chunking; the formatter builds the bytes of one event.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/error.h"

namespace idem::mcp {

// One dispatched event.
struct SseEvent {
  std::string type;  // the "event:" field; empty means the default type "message"
  std::string data;  // the "data:" lines joined with '\n'
  std::string id;    // the last event id in effect when the event was dispatched
};

// Incremental event-stream parser.
//
// Follows the WHATWG interpretation: lines end in CRLF, LF or CR (a CRLF split
// across two Feed calls counts once); a leading UTF-8 BOM is dropped; lines
// starting with ':' are comments; "field: value" loses one space after the
// colon; unknown fields are ignored; an event with no data is not dispatched
// (but its id still becomes the last event id). Bytes after the last blank
// line stay buffered; an unterminated event at end of stream is discarded, as
// the standard says.
//
// Not thread-safe: one parser per stream.
class SseParser {
 public:
  // `max_event_bytes` bounds the buffered bytes of one event (its lines and
  // data together), so a peer cannot make us buffer an unbounded stream.
  explicit SseParser(size_t max_event_bytes = 64 << 20) : max_event_bytes_(max_event_bytes) {}

  // Consumes `bytes` and appends every event completed by them to `out`.
  // kResourceExhausted once an event grows past max_event_bytes; the parser
  // then stays failed and every later call returns the same error.
  Result<void> Feed(std::string_view bytes, std::vector<SseEvent>& out);

  // The id of the last event seen ("" if none): what a reconnecting client
  // sends as Last-Event-ID.
  const std::string& last_event_id() const { return last_event_id_; }
  // The reconnection delay the server asked for with "retry:", if any.
  std::optional<std::chrono::milliseconds> retry() const { return retry_; }

 private:
  void ProcessLine(std::string_view line, std::vector<SseEvent>& out);

  size_t max_event_bytes_;
  std::string line_;  // the current, unterminated line
  std::string data_;
  std::string type_;
  bool has_data_ = false;
  bool after_cr_ = false;  // the previous byte was CR: a following LF ends nothing
  bool at_start_ = true;   // no byte seen yet (for the BOM)
  size_t bom_matched_ = 0;
  bool failed_ = false;
  std::string last_event_id_;
  std::optional<std::chrono::milliseconds> retry_;
};

// The bytes of one event whose data is `data` (split into one "data:" line
// per line of `data`), with "event: <type>" when `type` is not empty and
// "id: <id>" when `id` is not empty. Ends with the blank line that dispatches
// it.
std::string FormatSseEvent(std::string_view data, std::string_view type = "message",
                           std::string_view id = {});

// A comment line ": <text>" and blank line, used as a keep-alive.
std::string FormatSseComment(std::string_view text);

}  // namespace idem::mcp

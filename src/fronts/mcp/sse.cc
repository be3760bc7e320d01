#include "fronts/mcp/sse.h"

#include <charconv>

namespace idem::mcp {
namespace {

constexpr std::string_view kBom = "\xEF\xBB\xBF";

}  // namespace

Result<void> SseParser::Feed(std::string_view bytes, std::vector<SseEvent>& out) {
  auto exhausted = [this] {
    return MakeError(
        ErrorCode::kResourceExhausted,
        "an event-stream event is larger than " + std::to_string(max_event_bytes_) + " bytes");
  };
  if (failed_) return exhausted();
  size_t i = 0;
  // Drop a leading BOM, which may itself arrive split across calls.
  while (at_start_ && i < bytes.size()) {
    if (bytes[i] == kBom[bom_matched_]) {
      ++bom_matched_;
      ++i;
      if (bom_matched_ == kBom.size()) at_start_ = false;
      continue;
    }
    // Not a BOM after all: the bytes matched so far are content.
    line_.append(kBom.substr(0, bom_matched_));
    at_start_ = false;
  }
  for (; i < bytes.size(); ++i) {
    char c = bytes[i];
    if (c == '\n' && after_cr_) {
      after_cr_ = false;
      continue;
    }
    after_cr_ = false;
    if (c == '\r' || c == '\n') {
      after_cr_ = c == '\r';
      ProcessLine(line_, out);
      line_.clear();
      continue;
    }
    // Copy the run of ordinary bytes at once.
    size_t end = bytes.find_first_of("\r\n", i);
    if (end == std::string_view::npos) end = bytes.size();
    line_.append(bytes.substr(i, end - i));
    i = end - 1;
    if (line_.size() + data_.size() > max_event_bytes_) {
      failed_ = true;
      return exhausted();
    }
  }
  if (line_.size() + data_.size() > max_event_bytes_) {
    failed_ = true;
    return exhausted();
  }
  return {};
}

void SseParser::ProcessLine(std::string_view line, std::vector<SseEvent>& out) {
  if (line.empty()) {
    if (has_data_) {
      if (!data_.empty() && data_.back() == '\n') data_.pop_back();
      out.push_back(SseEvent{std::move(type_), std::move(data_), last_event_id_});
    }
    data_.clear();
    type_.clear();
    has_data_ = false;
    return;
  }
  if (line.front() == ':') return;  // a comment
  std::string_view field = line;
  std::string_view value;
  if (size_t colon = line.find(':'); colon != std::string_view::npos) {
    field = line.substr(0, colon);
    value = line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    data_.append(value);
    data_.push_back('\n');
    has_data_ = true;
  } else if (field == "event") {
    type_ = std::string(value);
  } else if (field == "id") {
    if (value.find('\0') == std::string_view::npos) last_event_id_ = std::string(value);
  } else if (field == "retry") {
    uint64_t ms = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), ms);
    if (ec == std::errc() && end == value.data() + value.size() && !value.empty()) {
      retry_ = std::chrono::milliseconds(ms);
    }
  }
}

std::string FormatSseEvent(std::string_view data, std::string_view type, std::string_view id) {
  std::string out;
  out.reserve(data.size() + 32);
  if (!type.empty()) {
    out.append("event: ").append(type).push_back('\n');
  }
  if (!id.empty()) {
    out.append("id: ").append(id).push_back('\n');
  }
  // One data line per line of `data`; CR, LF and CRLF all end a line.
  size_t pos = 0;
  while (true) {
    size_t end = data.find_first_of("\r\n", pos);
    out.append("data: ").append(data.substr(pos, end - pos)).push_back('\n');
    if (end == std::string_view::npos) break;
    pos = end + 1;
    if (data[end] == '\r' && pos < data.size() && data[pos] == '\n') ++pos;
  }
  out.push_back('\n');
  return out;
}

std::string FormatSseComment(std::string_view text) {
  std::string out = ": ";
  out.append(text).append("\n\n");
  return out;
}

}  // namespace idem::mcp

#include "fronts/mcp/sse.h"

#include <gtest/gtest.h>

namespace idem::mcp {
namespace {

std::vector<SseEvent> ParseAll(std::string_view bytes, SseParser& parser) {
  std::vector<SseEvent> out;
  EXPECT_TRUE(parser.Feed(bytes, out).has_value());
  return out;
}

std::vector<SseEvent> ParseAll(std::string_view bytes) {
  SseParser parser;
  return ParseAll(bytes, parser);
}

TEST(SseParser, OneEvent) {
  auto events = ParseAll("event: message\ndata: {\"a\":1}\n\n");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, "message");
  EXPECT_EQ(events[0].data, "{\"a\":1}");
  EXPECT_EQ(events[0].id, "");
}

TEST(SseParser, MultiLineDataJoinsWithNewline) {
  auto events = ParseAll("data: line one\ndata: line two\ndata:\n\n");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].data, "line one\nline two\n");
}

TEST(SseParser, CommentsAndUnknownFieldsAreIgnored) {
  auto events = ParseAll(": keep-alive\n\nfoo: bar\ndata: x\n: inside\n\n");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].data, "x");
}

TEST(SseParser, CrLfAndCrLineEndings) {
  auto events = ParseAll("data: a\r\n\r\ndata: b\r\rdata: c\n\n");
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].data, "a");
  EXPECT_EQ(events[1].data, "b");
  EXPECT_EQ(events[2].data, "c");
}

TEST(SseParser, CrLfSplitAcrossChunksCountsOnce) {
  SseParser parser;
  std::vector<SseEvent> out;
  ASSERT_TRUE(parser.Feed("data: a\r", out));
  ASSERT_TRUE(parser.Feed("\n", out));
  EXPECT_EQ(out.size(), 0u) << "CR then LF in the next chunk is one line end, not two";
  ASSERT_TRUE(parser.Feed("\r", out));
  ASSERT_EQ(out.size(), 1u);
  ASSERT_TRUE(parser.Feed("\ndata: b\n\n", out));
  ASSERT_EQ(out.size(), 2u) << "the LF after that CR is not another blank line";
  EXPECT_EQ(out[0].data, "a");
  EXPECT_EQ(out[1].data, "b");
}

TEST(SseParser, EveryChunkingGivesTheSameEvents) {
  std::string stream =
      "\xEF\xBB\xBFid: 7\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1}\r\n\r\n"
      ": c\ndata: x\rdata: y\r\n\nretry: 25\n\n";
  auto whole = ParseAll(stream);
  ASSERT_EQ(whole.size(), 2u);
  for (size_t split = 0; split <= stream.size(); ++split) {
    for (size_t split2 = split; split2 <= stream.size(); split2 += 7) {
      SseParser parser;
      std::vector<SseEvent> out;
      ASSERT_TRUE(parser.Feed(std::string_view(stream).substr(0, split), out));
      ASSERT_TRUE(parser.Feed(std::string_view(stream).substr(split, split2 - split), out));
      ASSERT_TRUE(parser.Feed(std::string_view(stream).substr(split2), out));
      ASSERT_EQ(out.size(), whole.size()) << "split at " << split << "," << split2;
      for (size_t i = 0; i < out.size(); ++i) {
        EXPECT_EQ(out[i].data, whole[i].data);
        EXPECT_EQ(out[i].id, whole[i].id);
        EXPECT_EQ(out[i].type, whole[i].type);
      }
      EXPECT_EQ(parser.retry(), std::chrono::milliseconds(25));
    }
  }
  EXPECT_EQ(whole[0].id, "7");
  EXPECT_EQ(whole[0].data, "{\"jsonrpc\":\"2.0\",\"id\":1}");
  EXPECT_EQ(whole[1].data, "x\ny");
  EXPECT_EQ(whole[1].id, "7") << "the last event id stays in effect";
}

TEST(SseParser, LeadingBomIsDroppedOnlyAtTheStart) {
  auto events = ParseAll(
      "\xEF\xBB\xBF"
      "data: a\n\n");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].data, "a");
  SseParser parser;
  std::vector<SseEvent> out;
  ASSERT_TRUE(parser.Feed("\xEF", out));
  ASSERT_TRUE(
      parser.Feed("\xBB\xBF"
                  "data: b\n\n",
                  out));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].data, "b");
}

TEST(SseParser, PrimingEventWithEmptyDataIsDispatchedAndSetsId) {
  SseParser parser;
  auto events = ParseAll("id: prime-1\ndata:\n\n", parser);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].data, "");
  EXPECT_EQ(parser.last_event_id(), "prime-1");
}

TEST(SseParser, EventWithoutDataIsNotDispatchedButIdSticks) {
  SseParser parser;
  auto events = ParseAll("id: 42\nevent: x\n\n", parser);
  EXPECT_TRUE(events.empty());
  EXPECT_EQ(parser.last_event_id(), "42");
}

TEST(SseParser, ValueKeepsAllButOneLeadingSpaceAndFieldWithoutColon) {
  auto events = ParseAll("data:  two spaces\ndata\n\n");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].data, " two spaces\n");
}

TEST(SseParser, InvalidRetryIsIgnored) {
  SseParser parser;
  ParseAll("retry: 12x\n\nretry: \n\n", parser);
  EXPECT_FALSE(parser.retry().has_value());
}

TEST(SseParser, UnterminatedEventIsNotDispatched) {
  auto events = ParseAll("data: a\n");
  EXPECT_TRUE(events.empty());
}

TEST(SseParser, OversizedEventFailsAndStaysFailed) {
  SseParser parser(16);
  std::vector<SseEvent> out;
  Result<void> r = parser.Feed("data: 0123456789012345678901234\n", out);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kResourceExhausted);
  EXPECT_FALSE(parser.Feed("\n", out));
  EXPECT_TRUE(out.empty());
}

TEST(SseParser, ManySmallEventsDoNotHitTheLimit) {
  SseParser parser(64);
  std::vector<SseEvent> out;
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(parser.Feed("data: 0123456789\n\n", out));
  EXPECT_EQ(out.size(), 1000u);
}

TEST(FormatSseEvent, RoundTripsThroughTheParser) {
  std::string data = "{\"a\":\"x\"}\r\n{\"b\":2}\r{\"c\":3}\n";
  std::string bytes = FormatSseEvent(data, "message", "e-1");
  EXPECT_EQ(
      bytes,
      "event: message\nid: e-1\ndata: {\"a\":\"x\"}\ndata: {\"b\":2}\ndata: {\"c\":3}\ndata: \n\n");
  auto events = ParseAll(bytes);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].data, "{\"a\":\"x\"}\n{\"b\":2}\n{\"c\":3}\n");
  EXPECT_EQ(events[0].id, "e-1");
  EXPECT_EQ(FormatSseEvent("{}", ""), "data: {}\n\n");
  EXPECT_TRUE(ParseAll(FormatSseComment("keep-alive")).empty());
}

}  // namespace
}  // namespace idem::mcp

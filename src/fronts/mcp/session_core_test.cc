#include "fronts/mcp/session_core.h"

#include <gtest/gtest.h>

namespace idem::mcp {
namespace {

// Security review F11: CallKeys and RecentKeys were bounded in entries only,
// and each entry held the client's call id, turn and tool name whole (up to
// 1 MiB each): one session could hold gigabytes.
TEST(SessionCoreTest, RememberedCallIdsAndToolsAreBoundedInBytes) {
  const std::string long_id(1 << 20, 'i');
  const std::string long_tool(1 << 20, 't');
  CallKeys keys;
  for (int i = 0; i < 8; ++i) {
    keys.Remember(long_id + std::to_string(i), long_tool, "v1t.k" + std::to_string(i), 4096);
  }
  EXPECT_LT(keys.Bytes(), 8 * 1024u) << "8 entries of two 1 MiB strings";
  EXPECT_EQ(keys.KeyOf(long_id + "3", long_tool), "v1t.k3") << "a long id is still recognised";
  EXPECT_EQ(keys.KeyOf(long_id + "3", "other"), std::nullopt);
  EXPECT_EQ(keys.KeyOf(long_id + "9", long_tool), std::nullopt);
  keys.Remember("short", "tool", "k", 4096);
  EXPECT_EQ(keys.KeyOf("short", "tool"), "k");

  RecentKeys recent;
  const TimePoint now{};
  for (int i = 0; i < 8; ++i) {
    recent.Note(long_id + std::to_string(i), long_tool, "k", now, Duration{60'000}, 1024);
  }
  EXPECT_LT(recent.Bytes(), 8 * 1024u);
  EXPECT_EQ(recent.Note(long_id + "2", long_tool, "other", now, Duration{60'000}, 1024), "k")
      << "a long turn is still recognised";
}

}  // namespace
}  // namespace idem::mcp

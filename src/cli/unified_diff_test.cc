// The unified diff `idemgate install` shows, checked against diff -u's format.
#include "unified_diff.h"

#include <gtest/gtest.h>

#include <string>

namespace idem::cli {
namespace {

TEST(UnifiedDiff, EqualTextsGiveNothing) { EXPECT_EQ(UnifiedDiff("a\n", "a\n", "x", "x"), ""); }

TEST(UnifiedDiff, OneChangedLineWithContext) {
  std::string before = "1\n2\n3\n4\n5\n6\n7\n8\n9\n";
  std::string after = "1\n2\n3\n4\nfive\n6\n7\n8\n9\n";
  EXPECT_EQ(UnifiedDiff(before, after, "a/f", "b/f"),
            "--- a/f\n+++ b/f\n@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n");
}

TEST(UnifiedDiff, DistantChangesMakeTwoHunksAndCloseOnesOne) {
  std::string before, after;
  for (int i = 1; i <= 20; ++i) {
    before += std::to_string(i) + "\n";
    after += (i == 2 || i == 18 ? "x" : std::to_string(i)) + "\n";
  }
  EXPECT_EQ(UnifiedDiff(before, after, "f", "f"),
            "--- f\n+++ f\n@@ -1,5 +1,5 @@\n 1\n-2\n+x\n 3\n 4\n 5\n"
            "@@ -15,6 +15,6 @@\n 15\n 16\n 17\n-18\n+x\n 19\n 20\n");
  EXPECT_EQ(UnifiedDiff("1\n2\n3\n4\n5\n6\n7\n8\n", "1\nx\n3\n4\n5\n6\ny\n8\n", "f", "f"),
            "--- f\n+++ f\n@@ -1,8 +1,8 @@\n 1\n-2\n+x\n 3\n 4\n 5\n 6\n-7\n+y\n 8\n");
}

TEST(UnifiedDiff, NewFileAndMissingFinalNewline) {
  EXPECT_EQ(UnifiedDiff("", "a\nb\n", "/dev/null", "f"),
            "--- /dev/null\n+++ f\n@@ -0,0 +1,2 @@\n+a\n+b\n");
  EXPECT_EQ(UnifiedDiff("{\n}", "{\n  \"a\": 1\n}", "f", "f"),
            "--- f\n+++ f\n@@ -1,2 +1,3 @@\n {\n+  \"a\": 1\n }\n\\ No newline at end of file\n");
}

TEST(UnifiedDiff, PastTheCellLimitTheMiddleIsReplacedWhole) {
  EXPECT_EQ(UnifiedDiff("a\nb\nc\n", "a\nx\ny\nc\n", "f", "f", 1),
            "--- f\n+++ f\n@@ -1,3 +1,4 @@\n a\n-b\n+x\n+y\n c\n");
}

}  // namespace
}  // namespace idem::cli

// Unified diff: common prefix and suffix set aside, the middle aligned by a
// longest-common-subsequence table, then grouped into hunks with context.
#include "unified_diff.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace idem::cli {
namespace {

// Lines with their newline (the last may have none).
std::vector<std::string_view> Lines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    size_t end = nl == std::string_view::npos ? text.size() : nl + 1;
    lines.push_back(text.substr(start, end - start));
    start = end;
  }
  return lines;
}

enum class Op : uint8_t { kSame, kRemove, kAdd };
struct Step {
  Op op;
  size_t a;  // line index in before (kSame, kRemove)
  size_t b;  // line index in after (kSame, kAdd)
};

std::vector<Step> Align(const std::vector<std::string_view>& a,
                        const std::vector<std::string_view>& b, size_t max_cells) {
  size_t prefix = 0;
  while (prefix < a.size() && prefix < b.size() && a[prefix] == b[prefix]) ++prefix;
  size_t suffix = 0;
  while (suffix < a.size() - prefix && suffix < b.size() - prefix &&
         a[a.size() - 1 - suffix] == b[b.size() - 1 - suffix]) {
    ++suffix;
  }
  std::vector<Step> steps;
  for (size_t i = 0; i < prefix; ++i) steps.push_back({Op::kSame, i, i});
  size_t n = a.size() - prefix - suffix, m = b.size() - prefix - suffix;
  if (n * m > max_cells) {
    for (size_t i = 0; i < n; ++i) steps.push_back({Op::kRemove, prefix + i, 0});
    for (size_t j = 0; j < m; ++j) steps.push_back({Op::kAdd, 0, prefix + j});
  } else {
    // lcs[i][j]: longest common subsequence of a[i..n) and b[j..m) (middle only).
    std::vector<uint32_t> lcs((n + 1) * (m + 1), 0);
    auto at = [&](size_t i, size_t j) -> uint32_t& { return lcs[i * (m + 1) + j]; };
    for (size_t i = n; i-- > 0;) {
      for (size_t j = m; j-- > 0;) {
        at(i, j) = a[prefix + i] == b[prefix + j] ? at(i + 1, j + 1) + 1
                                                  : std::max(at(i + 1, j), at(i, j + 1));
      }
    }
    size_t i = 0, j = 0;
    while (i < n || j < m) {
      if (i < n && j < m && a[prefix + i] == b[prefix + j]) {
        steps.push_back({Op::kSame, prefix + i++, prefix + j++});
      } else if (i < n && (j == m || at(i + 1, j) >= at(i, j + 1))) {
        steps.push_back({Op::kRemove, prefix + i++, 0});  // removals first, as diff -u
      } else {
        steps.push_back({Op::kAdd, 0, prefix + j++});
      }
    }
  }
  for (size_t k = 0; k < suffix; ++k) {
    steps.push_back({Op::kSame, a.size() - suffix + k, b.size() - suffix + k});
  }
  return steps;
}

void AppendLine(std::string& out, char mark, std::string_view line) {
  out += mark;
  out.append(line);
  if (line.empty() || line.back() != '\n') out += "\n\\ No newline at end of file\n";
}

// "start,count" of a hunk's range (diff's convention: start is 1-based, or
// the line before an empty range).
std::string Range(size_t start, size_t count) {
  return std::to_string(count == 0 ? start : start + 1) + "," + std::to_string(count);
}

}  // namespace

std::string UnifiedDiff(std::string_view before, std::string_view after,
                        std::string_view before_name, std::string_view after_name,
                        size_t max_cells) {
  if (before == after) return "";
  constexpr size_t kContext = 3;
  std::vector<std::string_view> a = Lines(before), b = Lines(after);
  std::vector<Step> steps = Align(a, b, max_cells);
  std::string out = "--- " + std::string(before_name) + "\n+++ " + std::string(after_name) + "\n";
  size_t k = 0;
  while (k < steps.size()) {
    if (steps[k].op == Op::kSame) {
      ++k;
      continue;
    }
    // A hunk: from kContext lines before this change to kContext lines after
    // the last change that is within 2 * kContext same lines of the next.
    size_t begin = k >= kContext ? k - kContext : 0;
    size_t end = k;
    while (end < steps.size()) {
      if (steps[end].op != Op::kSame) {
        ++end;
        continue;
      }
      size_t run = end;
      while (run < steps.size() && steps[run].op == Op::kSame) ++run;
      if (run < steps.size() && run - end <= 2 * kContext) {
        end = run;
      } else {
        end = std::min(run, end + kContext);
        break;
      }
    }
    size_t a_start = 0, a_count = 0, b_start = 0, b_count = 0;
    bool a_set = false, b_set = false;
    // Where each side's range starts, also for an empty one.
    size_t a_pos = 0, b_pos = 0;
    for (size_t s = 0; s < begin; ++s) {
      if (steps[s].op != Op::kAdd) a_pos = steps[s].a + 1;
      if (steps[s].op != Op::kRemove) b_pos = steps[s].b + 1;
    }
    std::string body;
    for (size_t s = begin; s < end; ++s) {
      const Step& step = steps[s];
      if (step.op != Op::kAdd) {
        if (!a_set) a_start = step.a, a_set = true;
        ++a_count;
      }
      if (step.op != Op::kRemove) {
        if (!b_set) b_start = step.b, b_set = true;
        ++b_count;
      }
      char mark = step.op == Op::kSame ? ' ' : step.op == Op::kRemove ? '-' : '+';
      AppendLine(body, mark, step.op == Op::kAdd ? b[step.b] : a[step.a]);
    }
    if (!a_set) a_start = a_pos;
    if (!b_set) b_start = b_pos;
    out += "@@ -" + Range(a_start, a_count) + " +" + Range(b_start, b_count) + " @@\n" + body;
    k = end;
  }
  return out;
}

}  // namespace idem::cli

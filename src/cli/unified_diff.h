// A unified diff of two texts, for showing a person what `idemgate install`
// changes in a file (`diff -u` format, 3 lines of context). Pure; no I/O.
#pragma once

#include <string>
#include <string_view>

namespace idem::cli {

// The diff of `before` and `after` by lines, headed `--- before_name` and
// `+++ after_name`; empty if the texts are equal. A last line without a
// newline is marked as diff marks it. Lines shared by both ends of the texts
// are set aside first, so a small edit of a large file costs little; past
// `max_cells` (lines before × lines after of what remains) the remaining
// lines are shown as removed and added instead of aligned.
std::string UnifiedDiff(std::string_view before, std::string_view after,
                        std::string_view before_name, std::string_view after_name,
                        size_t max_cells = 4'000'000);

}  // namespace idem::cli

#include "json/json_errors.h"

#include <boost/json/error.hpp>
#include <limits>

#include "idem/canonical_json.h"

namespace idem::json_text {

std::string DescribeJsonError(std::string_view text, boost::system::error_code error,
                              size_t max_depth) {
  if (error == boost::json::error::too_deep) {
    return "nested deeper than " + std::to_string(max_depth) + " levels";
  }
  // Only on this error path: the canonicalizer's parser names the byte and
  // the reason. Its messages start "invalid JSON at byte N: ". It builds a
  // tree of the text, so a huge text (an upstream's) keeps the short answer.
  constexpr size_t kMaxDescribedBytes = size_t{8} << 20;
  if (text.size() > kMaxDescribedBytes) return "not valid JSON (" + error.message() + ")";
  CanonOptions options;
  options.max_bytes = text.size();
  options.max_depth = std::numeric_limits<size_t>::max();
  Result<std::string> canonical = Canonicalize(text, options);
  constexpr std::string_view kPrefix = "invalid JSON ";
  if (!canonical && canonical.error().message.starts_with(kPrefix)) {
    return "not valid JSON " + canonical.error().message.substr(kPrefix.size());
  }
  return "not valid JSON (" + error.message() + ")";
}

}  // namespace idem::json_text

// ParseConfig (include/idem/config.h) on arbitrary TOML text: it never
// crashes; a refusal is kInvalidArgument with a message naming the source;
// an accepted config answers its lookups. Also the units and globs on the
// same bytes: ParseDuration / FormatDuration and ParseSize round-trip, and
// every pattern matches itself.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "idem/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  const auto config = idem::ParseConfig(text, "fuzz.toml");
  if (!config) {
    FUZZ_CHECK(config.error().code == idem::ErrorCode::kInvalidArgument);
    FUZZ_CHECK(config.error().message.find("fuzz.toml") != std::string::npos);
  } else {
    for (const auto& rule : config->tools) {
      FUZZ_CHECK(config->RuleFor(rule.match) != nullptr);
      (void)config->PolicyFor(rule.match);
      (void)config->ModeFor(rule.match, true);
      (void)config->ModeFor(rule.match, false);
    }
    (void)config->RouteFor("POST", "/v1/charges");
    (void)config->PolicyForRoute("PUT", "/");
    (void)config->TenantForToken(text);
  }

  // Units: whatever parses formats to a form that parses to the same value.
  const std::string_view line = text.substr(0, text.find('\n'));
  if (const auto d = idem::ParseDuration(line)) {
    const auto again = idem::ParseDuration(idem::FormatDuration(*d));
    FUZZ_CHECK(again.has_value());
    FUZZ_CHECK(*again == *d);
  } else {
    FUZZ_CHECK(d.error().code == idem::ErrorCode::kInvalidArgument);
  }
  if (const auto s = idem::ParseSize(line); !s) {
    FUZZ_CHECK(s.error().code == idem::ErrorCode::kInvalidArgument);
  }

  // Globs: a pattern matches itself; bounded time on any pattern.
  FUZZ_CHECK(idem::GlobMatch(line, line));
  (void)idem::GlobMatch(line, text.substr(line.size()));
  return 0;
}

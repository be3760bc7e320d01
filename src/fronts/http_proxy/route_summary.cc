#include "fronts/http_proxy/route_summary.h"

namespace idem::proxy {
namespace {

std::string Join(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : ",") + p;
  return out;
}

// "in the header Idempotency-Key", "in the body field idempotency_key".
std::string KeyPlace(const RouteRule& rule) {
  std::string out;
  if (!rule.key_header.empty()) out = "key in the header " + rule.key_header;
  if (!rule.key_field.empty()) {
    out += (out.empty() ? "key in" : " and") + std::string(" the body field ") + rule.key_field;
  }
  return out.empty() ? "key not forwarded" : out;
}

std::string ModeText(const RouteRule& rule, const Config& config) {
  if (!rule.mode) {
    return "gated with Idempotency-Key or " + config.http.turn_header + ", else passed through";
  }
  return "mode " + std::string(KeyModeName(*rule.mode));
}

bool HasMutatingMethod(const RouteRule& rule) {
  for (const std::string& m : rule.methods) {
    if (m == "POST" || m == "PUT" || m == "PATCH" || m == "DELETE") return true;
  }
  return false;
}

// The warning or note about the vendor's window of `rule`, if any.
std::optional<std::string> WindowLine(const RouteRule& rule, const Config& config) {
  const VendorProfile* profile = rule.profile ? FindVendorProfile(*rule.profile) : nullptr;
  const std::string vendor = profile ? std::string(profile->vendor) : "the vendor";
  if (!rule.vendor_window) {
    if (profile == nullptr) return std::nullopt;
    return "note: " + vendor + " publishes no period for which it keeps a key (" +
           std::string(profile->source) + "); set vendor_window on route " + rule.match +
           " to be warned when its ttl outlives it";
  }
  const Duration ttl = rule.overrides.ApplyTo(config.defaults).ttl;
  if (ttl <= *rule.vendor_window) return std::nullopt;
  std::string line = "warning: route " + rule.match + " keeps records for " + FormatDuration(ttl) +
                     ", but " + vendor + " keeps a key for " +
                     FormatDuration(*rule.vendor_window);
  if (profile != nullptr) {
    line += " (profile \"" + *rule.profile + "\", " + std::string(profile->source) + ")";
  }
  return line + ": a retry idemgate forwards after that (an unknown outcome under on_unknown = "
                "\"retry\", a takeover) runs again at the vendor; set ttl to at most " +
         FormatDuration(*rule.vendor_window) + ", or vendor_window if your account keeps keys longer";
}

}  // namespace

std::vector<std::string> DescribeRoutes(const Config& config) {
  std::vector<std::string> lines;
  std::vector<std::string> windows;
  bool put_or_delete = false;
  for (const RouteRule& rule : config.routes) {
    for (const std::string& m : rule.methods) put_or_delete |= m == "PUT" || m == "DELETE";
    if (rule.mode == KeyMode::kOff) {
      if (HasMutatingMethod(rule)) {
        lines.push_back("NOT gated: " + Join(rule.methods) + " " + rule.match +
                        " (mode = \"off\"): its retries run again");
      }
      continue;
    }
    std::string line = "route " + Join(rule.methods) + " " + rule.match + ": " +
                       ModeText(rule, config) + ", " + KeyPlace(rule) + ", results kept " +
                       FormatDuration(rule.overrides.ApplyTo(config.defaults).ttl);
    if (rule.profile) line += ", profile " + *rule.profile;
    lines.push_back(std::move(line));
    if (auto w = WindowLine(rule, config)) windows.push_back(std::move(*w));
  }
  lines.push_back("other POST and PATCH requests: gated with Idempotency-Key or " +
                  config.http.turn_header + ", else passed through; key in the header "
                  "Idempotency-Key, results kept " +
                  FormatDuration(config.defaults.ttl));
  if (!put_or_delete) {
    lines.push_back("NOT gated: PUT and DELETE (no [[route]] lists them in methods)");
  }
  lines.insert(lines.end(), windows.begin(), windows.end());
  return lines;
}

Result<void> CheckLeasesOutliveRequests(const Config& config) {
  const Duration open_for = config.http.upstream_connect_timeout + config.http.upstream_timeout;
  auto check = [&](const Policy& policy, const std::string& where) -> Result<void> {
    if (policy.lease > open_for) return {};
    return MakeError(
        ErrorCode::kInvalidArgument,
        where + " has lease = \"" + FormatDuration(policy.lease) +
            "\", not longer than a request to the vendor can stay open (upstream_connect_timeout " +
            FormatDuration(config.http.upstream_connect_timeout) + " + upstream_timeout " +
            FormatDuration(config.http.upstream_timeout) +
            "): an instance cut off from the store would lose the lease while the vendor may "
            "still act, and a retry would run the call again; set lease above " +
            FormatDuration(open_for) + " or lower upstream_timeout in [http]");
  };
  if (auto ok = check(config.defaults, "[defaults]"); !ok) return ok;
  for (const RouteRule& rule : config.routes) {
    if (auto ok = check(rule.overrides.ApplyTo(config.defaults), "route " + rule.match); !ok) {
      return ok;
    }
  }
  return {};
}

}  // namespace idem::proxy

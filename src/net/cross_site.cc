#include "net/cross_site.h"

#include <boost/beast/core/string.hpp>
#include <string>

#include "net/http_rules.h"

namespace idem::http {

std::optional<Response> CrossSiteRefusal(const Request& request) {
  if (auto site = request.FindHeader("Sec-Fetch-Site");
      site && *site != "same-origin" && *site != "none") {
    return Problem(403, "cross-site", "Cross-site request",
                   "idemgate: a request sent by a web page of another site (Sec-Fetch-Site: " +
                       net::PrintableExcerpt(*site, 32) +
                       ") is refused; use the console's own page, or a client that is not a "
                       "browser");
  }
  if (auto origin = request.FindHeader("Origin")) {
    auto host = request.FindHeader("Host");
    const bool same = host && (boost::beast::iequals(*origin, "http://" + std::string(*host)) ||
                               boost::beast::iequals(*origin, "https://" + std::string(*host)));
    if (!same) {
      return Problem(403, "cross-site", "Cross-site request",
                     "idemgate: Origin '" + net::PrintableExcerpt(*origin, 100) +
                         "' is not this listener's; use the console's own page, or a client "
                         "that is not a browser");
    }
  }
  return std::nullopt;
}

Handler RefuseCrossSite(Handler next) {
  return [next = std::move(next)](Request&& request, Responder respond) {
    if (auto refused = CrossSiteRefusal(request)) return respond(std::move(*refused));
    next(std::move(request), std::move(respond));
  };
}

Handler SandboxAnswers(Handler next) {
  return [next = std::move(next)](Request&& request, Responder respond) {
    next(std::move(request), [respond = std::move(respond)](Response r) {
      r.headers.push_back({"Content-Security-Policy", "sandbox"});
      respond(std::move(r));
    });
  };
}

}  // namespace idem::http

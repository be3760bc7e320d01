#include "net/http_target.h"

#include <boost/url/parse.hpp>
#include <boost/url/url.hpp>

namespace idem::net {

std::string HttpTarget::RequestTarget() const {
  std::string target = path.empty() ? "/" : path;
  if (!query.empty()) target.append("?").append(query);
  return target;
}

std::string HttpTarget::Display() const {
  return (tls ? "https://" : "http://") + host_header + RequestTarget();
}

Result<HttpTarget> ParseHttpTarget(std::string_view url, std::string_view what) {
  std::string shown(url);  // what messages repeat of the URL
  auto bad = [&](std::string_view why) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "invalid " + std::string(what) + " '" + shown + "': " + std::string(why) +
                         " (expected http://HOST[:PORT][/PATH] or https://…)");
  };
  auto parsed = boost::urls::parse_uri(url);
  if (!parsed) return bad("not an absolute URL (" + parsed.error().message() + ")");
  const boost::urls::url_view u = *parsed;
  HttpTarget t;
  if (u.scheme() == "https") {
    t.tls = true;
  } else if (u.scheme() != "http") {
    return bad("the scheme must be http or https");
  }
  if (u.has_userinfo()) {
    shown = boost::urls::url(u).remove_userinfo().buffer();  // never repeat a password
    return bad("credentials in the URL are not supported; send them as a header (Authorization)");
  }
  if (u.has_fragment()) return bad("a fragment ('#…') is not allowed");
  t.host = std::string(u.host_address());
  if (t.host.empty()) return bad("no host");
  t.port = u.has_port() ? std::string(u.port()) : (t.tls ? "443" : "80");
  t.host_header = std::string(u.encoded_host_and_port());
  t.path = std::string(u.encoded_path());
  if (u.has_query()) t.query = std::string(u.encoded_query());
  return t;
}

}  // namespace idem::net

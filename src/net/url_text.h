// URLs repeated in messages and logs: never with their password.
#pragma once

#include <string>
#include <string_view>

namespace idem::net {

// `url` with the password of its user info replaced by "***":
// "redis://alice:s3cret@host:6379/0" → "redis://alice:***@host:6379/0". Any
// URL-like text works (several hosts, no scheme); text without a password is
// returned as it is. The values of query parameters that carry a secret
// (password, sslpassword, passwd, pass, secret, token; any case) are
// replaced too: "postgres://db/idem?password=s3cret" →
// "postgres://db/idem?password=***" (libpq accepts both places).
std::string WithoutPassword(std::string_view url);

}  // namespace idem::net

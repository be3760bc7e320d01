// Whether a store URL crosses the network without verified TLS (security
// review F17): libpq's default sslmode=prefer is opportunistic TLS that an
// active attacker can strip, redis:// is plaintext, and rediss:// with
// tls_verify=false trusts any certificate. No I/O.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace idem {

// One line for the front's log when `url` names a store host that is not on
// this machine (not a loopback name or address, not a Unix socket) and the
// connection's TLS is not verified, saying what to write instead; nullopt
// otherwise (memory:, sqlite:, loopback hosts, rediss:// verified,
// postgres sslmode=verify-full) and for a URL that does not parse (opening
// the store reports that).
std::optional<std::string> UnverifiedStoreTransport(std::string_view url);

}  // namespace idem

// The request target a listener hands to its front, normalised once, before
// routes are matched and before it is forwarded upstream (security review
// F10): a route's mode must not be skippable by spelling the same path
// differently, and what the upstream receives is the path that was matched.
#pragma once

#include <string>
#include <string_view>

#include "idem/error.h"

namespace idem::net {

// The origin-form target ("/path?query") of a request whose target is
// `target` and whose Host header is `host` (empty when absent). The path is
// normalised (RFC 3986 §6.2.2): percent-escapes of unreserved characters
// (ALPHA DIGIT - . _ ~) decoded, the hex digits of the others upper-cased,
// runs of '/' collapsed to one, then "." and ".." segments removed (§5.2.4;
// ".." at the root stays at the root). The query is kept as it came. Case
// is kept (paths are case-sensitive), and so is an encoded '/' (%2F): it is
// part of a segment, not a separator.
//
// An absolute-form target ("http://host/path", RFC 9112 §3.2.2) is taken as
// its origin-form only when its authority is `host`; it is refused when it
// names another host, since a listener serves only itself. kInvalidArgument,
// with a message saying what was wrong, for that, for authority- and
// asterisk-form (CONNECT, OPTIONS *), and for a malformed percent-escape.
Result<std::string> NormalizeTarget(std::string_view target, std::string_view host);

}  // namespace idem::net

// Opening the listening socket of an HTTP listener (`mcp --listen`, `serve`,
// `http`): one place for the address rules of docs/DESIGN.md §8.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "idem/error.h"

namespace idem::net {

struct ListeningSocket {
  std::string bound;     // "127.0.0.1:41873": the address actually bound
  bool loopback = true;  // the bound address is a loopback one
};

// Resolves `listen` (HOST:PORT; port 0 picks a free one), then opens, binds
// and listens `acceptor` on it. kInvalidArgument for a bad or unresolvable
// address, or a non-loopback one when neither `tokens_configured` nor
// `insecure_no_auth`; kUnavailable if it cannot be bound.
Result<ListeningSocket> OpenListeningSocket(boost::asio::ip::tcp::acceptor& acceptor,
                                            const std::string& listen, bool tokens_configured,
                                            bool insecure_no_auth);

// ── The descriptor budget of a listener (security review F2) ──

// Connections past max_connections that may be open at once, each being
// answered 503 and closed within kOverLimitLinger. Past max_connections +
// this, the listener stops accepting until a connection closes: the kernel's
// backlog holds the rest, and no descriptor is spent on them.
inline constexpr size_t kOverLimitReserve = 64;
// How long an over-limit connection may still send (and be discarded) after
// its 503, so that it reads the answer instead of a reset.
inline constexpr std::chrono::milliseconds kOverLimitLinger{1000};
// Descriptors a front needs besides its connections: the store's (SQLite
// files, Redis and PostgreSQL connections), upstream connections, MCP
// children's pipes, logs.
inline constexpr size_t kOtherDescriptors = 128;
// How long accepting pauses after an accept error that would recur at once
// (out of descriptors or kernel memory).
inline constexpr std::chrono::milliseconds kAcceptPause{100};

// Whether accept's error `ec` means the process or the system is out of
// descriptors (EMFILE, ENFILE) or kernel memory (ENOBUFS, ENOMEM): the
// connection stays in the backlog, so accepting again at once fails again.
bool IsOutOfDescriptors(const boost::system::error_code& ec);

// Open descriptors a listener with `max_connections` may need:
// max_connections + kOverLimitReserve + kOtherDescriptors.
size_t DescriptorsNeeded(size_t max_connections);

// A warning for the log when the process's open-file soft limit
// (RLIMIT_NOFILE) is below DescriptorsNeeded(max_connections), naming the
// listener `name`, both figures and what to do; nullopt when it is enough
// (or unlimited).
std::optional<std::string> DescriptorLimitWarning(std::string_view name, size_t max_connections);

}  // namespace idem::net

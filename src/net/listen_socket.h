// Opening the listening socket of an HTTP listener (`mcp --listen`, `serve`,
// `http`): one place for the address rules of docs/DESIGN.md §8.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <string>

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

}  // namespace idem::net

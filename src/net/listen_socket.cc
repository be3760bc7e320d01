#include "net/listen_socket.h"

#include <sys/resource.h>

#include <boost/asio.hpp>
#include <cerrno>

#include "fronts/mcp/http_protocol.h"

namespace idem::net {

Result<ListeningSocket> OpenListeningSocket(boost::asio::ip::tcp::acceptor& acceptor,
                                            const std::string& listen, bool tokens_configured,
                                            bool insecure_no_auth) {
  namespace net = boost::asio;
  using tcp = net::ip::tcp;
  Result<HostPort> where = ParseHostPort(listen);
  if (!where) return std::unexpected(where.error());

  boost::system::error_code ec;
  tcp::resolver resolver(acceptor.get_executor());
  auto results = resolver.resolve(where->host, std::to_string(where->port),
                                  tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "cannot resolve listen host '" + where->host + "': " + ec.message());
  }
  bool loopback = true;
  for (const auto& entry : results) loopback = loopback && entry.endpoint().address().is_loopback();
  if (!loopback && !tokens_configured && !insecure_no_auth) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "refusing to listen on " + listen +
                         ": it is not a loopback address and no tokens are configured; add "
                         "[[tenant]] tokens to the config, bind 127.0.0.1, or pass "
                         "--insecure-no-auth (docs/DESIGN.md §8)");
  }
  tcp::endpoint endpoint = results.begin()->endpoint();
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return MakeError(ErrorCode::kUnavailable, "cannot listen on " + listen + ": " + ec.message());
  }
  tcp::endpoint local = acceptor.local_endpoint(ec);
  return ListeningSocket{FormatHostPort(local.address().to_string(), local.port()),
                         local.address().is_loopback()};
}

bool IsOutOfDescriptors(const boost::system::error_code& ec) {
  if (ec.category() != boost::system::system_category()) return false;
  const int e = ec.value();
  return e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM;
}

size_t DescriptorsNeeded(size_t max_connections) {
  return max_connections + kOverLimitReserve + kOtherDescriptors;
}

std::optional<std::string> DescriptorLimitWarning(std::string_view name, size_t max_connections) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return std::nullopt;
  const size_t needed = DescriptorsNeeded(max_connections);
  if (limit.rlim_cur >= needed) return std::nullopt;
  return "idemgate " + std::string(name) + ": warning: the open-file limit (RLIMIT_NOFILE) is " +
         std::to_string(limit.rlim_cur) + ", below the " + std::to_string(needed) +
         " descriptors that " + std::to_string(max_connections) +
         " connections (max_connections) need with the store and upstreams; past it new "
         "connections wait unanswered. Raise it (LimitNOFILE= in the systemd unit, ulimit -n) "
         "or lower max_connections\n";
}

}  // namespace idem::net

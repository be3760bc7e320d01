// One client connection to an HTTP upstream, plain or TLS, for the HTTP
// client (http_client.h). Not thread-safe: the client runs each connection
// on its own strand.
#pragma once

#include <sys/socket.h>

#include <boost/beast/core.hpp>
#include <boost/beast/ssl.hpp>
#include <cerrno>
#include <chrono>
#include <optional>

namespace idem::net {

struct ClientConn {
  // Beast reads at most the buffer's free space (at least 512 bytes), and a
  // parser that moves each body byte out keeps the buffer small: without
  // this reserve, a large answer came 512 bytes per recvmsg.
  ClientConn() { buffer.reserve(64 * 1024); }

  std::optional<boost::beast::tcp_stream> plain;
  std::optional<boost::beast::ssl_stream<boost::beast::tcp_stream>> tls;
  boost::beast::flat_buffer buffer;
  std::chrono::steady_clock::time_point idle_since;

  boost::beast::tcp_stream& lowest() { return tls ? boost::beast::get_lowest_layer(*tls) : *plain; }
  // Calls `f` with the stream to read and write: the TLS one, or the plain one.
  template <class F>
  void With(F&& f) {
    if (tls) {
      f(*tls);
    } else {
      f(*plain);
    }
  }
  void Close() {
    boost::beast::error_code ignored;
    lowest().socket().shutdown(boost::asio::ip::tcp::socket::shutdown_both, ignored);
    lowest().close();
  }
  // True if the peer has not closed an idle connection. A plain connection
  // with unread bytes is also unusable (a stray answer); on TLS they may be
  // session tickets.
  bool Alive() {
    if (!lowest().socket().is_open() || buffer.size() > 0) return false;
    char c;
    ssize_t n = ::recv(lowest().socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return false;
    if (n > 0) return tls.has_value();
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
};

}  // namespace idem::net

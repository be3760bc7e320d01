#include "redis_connection.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <expected>

namespace idem::redis {
namespace {

using SteadyClock = std::chrono::steady_clock;

// Waits until `fd` is ready for `events` (or has an error or hang-up, which
// the next read or write reports); false once `deadline` has passed.
bool WaitReady(int fd, short events, SteadyClock::time_point deadline) {
  for (;;) {
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - SteadyClock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, INT_MAX)));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return true;  // let the I/O call report it
  }
}

// A non-blocking TCP connection to `node`, or why not.
std::expected<int, std::string> ConnectSocket(const NodeAddress& node, Duration timeout,
                                              SteadyClock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  const std::string port = std::to_string(node.port);
  if (int e = getaddrinfo(node.host.c_str(), port.c_str(), &hints, &list); e != 0) {
    return std::unexpected("cannot resolve " + node.host + ": " + gai_strerror(e));
  }
  std::string why = "no address";
  for (addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    int err = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      if (!WaitReady(fd, POLLOUT, deadline)) {
        err = ETIMEDOUT;
      } else {
        socklen_t len = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      }
    }
    if (err != 0) {
      why = err == ETIMEDOUT
                ? "no answer within the connect timeout of " + DescribeDuration(timeout)
                : std::strerror(err);
      close(fd);
      continue;
    }
    // As hiredis did: no Nagle delay, and keep-alive probes after 15 s idle
    // (every 5 s, 3 times) so that a vanished server is noticed.
    int one = 1, idle = 15, interval = 5, count = 3;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
    freeaddrinfo(list);
    return fd;
  }
  freeaddrinfo(list);
  return std::unexpected(why);
}

// OpenSSL's socket BIO writes with write(), which raises SIGPIPE on a closed
// connection and would kill a program that links the store without ignoring
// it. This one sends with MSG_NOSIGNAL.
int BioWrite(BIO* bio, const char* data, int len) {
  BIO_clear_retry_flags(bio);
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(bio)));
  ssize_t n = send(fd, data, static_cast<size_t>(len), MSG_NOSIGNAL);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    BIO_set_retry_write(bio);
  }
  return static_cast<int>(n);
}

int BioRead(BIO* bio, char* data, int len) {
  BIO_clear_retry_flags(bio);
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(bio)));
  ssize_t n = recv(fd, data, static_cast<size_t>(len), 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    BIO_set_retry_read(bio);
  }
  return static_cast<int>(n);
}

long BioCtrl(BIO*, int cmd, long, void*) { return cmd == BIO_CTRL_FLUSH ? 1 : 0; }

BIO* NewSocketBio(int fd) {
  static BIO_METHOD* const method = [] {
    BIO_METHOD* m =
        BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "idemgate redis socket");
    BIO_meth_set_write(m, BioWrite);
    BIO_meth_set_read(m, BioRead);
    BIO_meth_set_ctrl(m, BioCtrl);
    return m;
  }();
  BIO* bio = BIO_new(method);
  if (bio == nullptr) return nullptr;
  BIO_set_data(bio, reinterpret_cast<void*>(static_cast<intptr_t>(fd)));
  BIO_set_init(bio, 1);
  return bio;
}

constexpr std::string_view kClosed = "the server closed the connection";

// Why an SSL call failed, from SSL_get_error's `code`.
std::string TlsFailure(int code) {
  if (code == SSL_ERROR_ZERO_RETURN) return std::string(kClosed);
  if (code == SSL_ERROR_SYSCALL) {
    return errno != 0 ? std::string(std::strerror(errno)) : std::string(kClosed);
  }
  std::string why = net::TlsErrors("TLS error");
  if (why.find("unexpected eof") != std::string::npos) return std::string(kClosed);
  if (why.find("certificate required") != std::string::npos) {
    why += " (the server wants a client certificate: give tls_cert and tls_key)";
  }
  return "TLS: " + why;
}

}  // namespace

bool IsError(const redisReply& r, std::string_view prefix) {
  return r.type == REDIS_REPLY_ERROR && Text(r).starts_with(prefix);
}

std::string_view Text(const redisReply& r) {
  if (r.type == REDIS_REPLY_STRING || r.type == REDIS_REPLY_STATUS || r.type == REDIS_REPLY_ERROR) {
    return std::string_view(r.str, r.len);
  }
  return {};
}

std::string DescribeDuration(Duration d) {
  if (d.count() % 1000 == 0) return std::to_string(d.count() / 1000) + "s";
  return std::to_string(d.count()) + "ms";
}

Connection::Connection(int fd, NodeAddress node, Duration command_timeout)
    : fd_(fd),
      reader_(redisReaderCreate()),
      node_(std::move(node)),
      command_timeout_(command_timeout) {}

Connection::~Connection() {
  if (ssl_ != nullptr) {
    if (!broken_) SSL_shutdown(ssl_);  // close_notify, best effort: never waits
    SSL_free(ssl_);
  }
  close(fd_);
  redisReaderFree(reader_);
}

std::optional<Error> ConnectBackoff::Check() const {
  std::lock_guard lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (failures_ == 0 || now >= retry_at_) return std::nullopt;
  const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(retry_at_ - now);
  return Error{ErrorCode::kUnavailable,
               last_error_ + " (next connect attempt in " + std::to_string(wait.count()) + " ms)",
               /*unreached=*/true};
}

void ConnectBackoff::Failed(const Error& error) {
  std::lock_guard lock(mu_);
  ++failures_;
  retry_at_ = std::chrono::steady_clock::now() +
              std::chrono::milliseconds(std::min(25 << std::min(failures_ - 1, 6), 1000));
  last_error_ = error.message;
}

void ConnectBackoff::Reached() {
  std::lock_guard lock(mu_);
  failures_ = 0;
}

Result<std::unique_ptr<Connection>> Connection::Open(const NodeAddress& node,
                                                     const ConnectOptions& options) {
  const auto deadline = SteadyClock::now() + options.connect_timeout;
  auto fd = ConnectSocket(node, options.connect_timeout, deadline);
  if (!fd) {
    return std::unexpected(Error{ErrorCode::kUnavailable,
                                 "redis store " + node.ToString() + " is unreachable: " +
                                     fd.error() + "; retryable once the server is back",
                                 /*unreached=*/true});
  }
  std::unique_ptr<Connection> conn(new Connection(*fd, node, options.command_timeout));
  if (options.tls) {
    if (auto r = conn->Handshake(*options.tls, deadline); !r) return std::unexpected(r.error());
  }

  std::vector<Command> setup;
  if (!options.password.empty()) {
    if (options.user.empty()) {
      setup.push_back({"AUTH", options.password});
    } else {
      setup.push_back({"AUTH", options.user, options.password});
    }
  }
  if (options.db != 0) setup.push_back({"SELECT", std::to_string(options.db)});
  if (!setup.empty()) {
    auto replies = conn->Pipeline(setup);
    if (!replies) return std::unexpected(replies.error());
    for (const Reply& r : *replies) {
      if (IsError(*r)) {
        return MakeError(ErrorCode::kUnavailable,
                         "redis store " + node.ToString() + " refused the connection setup (" +
                             std::string(Text(*r)) +
                             "); check the user, password and database in the store URL");
      }
    }
  }
  return conn;
}

Result<void> Connection::Handshake(const TlsConnect& tls, Deadline deadline) {
  ERR_clear_error();
  ssl_ = SSL_new(tls.ctx.get());
  BIO* bio = ssl_ != nullptr ? NewSocketBio(fd_) : nullptr;
  if (bio == nullptr) {
    return std::unexpected(Broken(net::TlsErrors("out of memory"), "starting TLS"));
  }
  SSL_set_bio(ssl_, bio, bio);
  // A read that meets a record without data (a TLS 1.3 session ticket)
  // returns, so that a read after poll() never blocks.
  SSL_clear_mode(ssl_, SSL_MODE_AUTO_RETRY);
  SSL_set_mode(ssl_, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  net::PrepareTlsClient(ssl_, tls.server_name.empty() ? node_.host : tls.server_name, tls.verify);
  for (;;) {
    ERR_clear_error();
    errno = 0;
    const int r = SSL_connect(ssl_);
    if (r == 1) return {};
    const int code = SSL_get_error(ssl_, r);
    if (code == SSL_ERROR_WANT_READ || code == SSL_ERROR_WANT_WRITE) {
      if (WaitReady(fd_, code == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline)) continue;
      return std::unexpected(Broken(
          "no TLS handshake within the connect timeout (is the port a TLS port?)", "connecting"));
    }
    std::string why = TlsFailure(code);
    if (long v = SSL_get_verify_result(ssl_); v != X509_V_OK) {
      why += std::string(" (") + X509_verify_cert_error_string(v) + ")";
    }
    broken_ = true;
    return MakeError(ErrorCode::kUnavailable,
                     "redis store " + node_.ToString() + ": the TLS handshake failed: " + why +
                         "; check tls_ca, tls_cert, tls_key and tls_server_name in the store URL");
  }
}

Connection::Deadline Connection::CommandDeadline() const {
  return SteadyClock::now() + command_timeout_;
}

Error Connection::Broken(std::string_view why, std::string_view doing) {
  broken_ = true;
  return Error{ErrorCode::kUnavailable, "redis store " + node_.ToString() + ": " +
                                            std::string(why) + " while " + std::string(doing) +
                                            "; retryable"};
}

Result<size_t> Connection::ReadSome() {
  char buf[16 * 1024];
  size_t total = 0;
  for (;;) {
    size_t got = 0;
    if (ssl_ != nullptr) {
      ERR_clear_error();
      errno = 0;
      const int r = SSL_read(ssl_, buf, sizeof buf);
      if (r <= 0) {
        const int code = SSL_get_error(ssl_, r);
        if (code == SSL_ERROR_WANT_READ || code == SSL_ERROR_WANT_WRITE) return total;
        return std::unexpected(Broken(TlsFailure(code), "reading"));
      }
      got = static_cast<size_t>(r);
    } else {
      const ssize_t n = recv(fd_, buf, sizeof buf, 0);
      if (n == 0) return std::unexpected(Broken(kClosed, "reading"));
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return total;
        return std::unexpected(Broken(std::strerror(errno), "reading"));
      }
      got = static_cast<size_t>(n);
    }
    if (redisReaderFeed(reader_, buf, got) != REDIS_OK) {
      return std::unexpected(Broken(reader_->errstr, "reading"));
    }
    total += got;
    // Plain: a short read emptied the socket. TLS: what is left of the
    // current record; the next one shows in poll().
    const bool more = ssl_ != nullptr ? SSL_pending(ssl_) > 0 : got == sizeof buf;
    if (!more) return total;
  }
}

Result<void> Connection::WriteAll(Deadline deadline) {
  size_t off = 0;
  while (off < out_.size()) {
    const size_t len = std::min<size_t>(out_.size() - off, INT_MAX);
    short wait = POLLOUT;
    if (ssl_ != nullptr) {
      ERR_clear_error();
      errno = 0;
      const int r = SSL_write(ssl_, out_.data() + off, static_cast<int>(len));
      if (r > 0) {
        off += static_cast<size_t>(r);
        continue;
      }
      const int code = SSL_get_error(ssl_, r);
      if (code == SSL_ERROR_WANT_READ) {
        wait = POLLIN;
      } else if (code != SSL_ERROR_WANT_WRITE) {
        out_.clear();
        return std::unexpected(Broken(TlsFailure(code), "writing"));
      }
    } else {
      const ssize_t n = send(fd_, out_.data() + off, len, MSG_NOSIGNAL);
      if (n > 0) {
        off += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        out_.clear();
        return std::unexpected(Broken(std::strerror(errno), "writing"));
      }
    }
    if (!WaitReady(fd_, wait, deadline)) {
      out_.clear();
      return std::unexpected(Broken("the server took no data within the command timeout of " +
                                        DescribeDuration(command_timeout_),
                                    "writing"));
    }
  }
  out_.clear();
  return {};
}

Result<std::vector<Reply>> Connection::Pipeline(std::span<const Command> commands) {
  if (broken_) return std::unexpected(Broken("the connection broke earlier", "reusing it"));
  for (const Command& c : commands) Append(c);
  const Deadline deadline = CommandDeadline();
  if (auto written = WriteAll(deadline); !written) return std::unexpected(written.error());
  std::vector<Reply> replies;
  replies.reserve(commands.size());
  while (replies.size() < commands.size()) {
    void* raw = nullptr;
    if (redisReaderGetReply(reader_, &raw) != REDIS_OK) {
      return std::unexpected(Broken(reader_->errstr, "parsing a reply"));
    }
    if (raw != nullptr) {
      replies.emplace_back(static_cast<redisReply*>(raw));
      continue;
    }
    const Command& waiting = commands[replies.size()];
    const std::string doing = "running " + (waiting.empty() ? std::string() : waiting[0]);
    if (!WaitReady(fd_, POLLIN, deadline)) {
      return std::unexpected(Broken(
          "no reply within the command timeout of " + DescribeDuration(command_timeout_), doing));
    }
    if (auto read = ReadSome(); !read) return std::unexpected(read.error());
  }
  return replies;
}

Result<Reply> Connection::Run(const Command& command) {
  auto replies = Pipeline(std::span<const Command>(&command, 1));
  if (!replies) return std::unexpected(replies.error());
  return std::move(replies->front());
}

void Connection::Append(const Command& command) {
  // RESP: *<argc>\r\n then $<len>\r\n<bytes>\r\n per argument.
  auto number = [this](char tag, size_t n) {
    char buf[24];
    buf[0] = tag;
    char* end = std::to_chars(buf + 1, buf + sizeof buf - 2, n).ptr;
    *end++ = '\r';
    *end++ = '\n';
    out_.append(buf, end);
  };
  number('*', command.size());
  for (const std::string& arg : command) {
    number('$', arg.size());
    out_.append(arg).append("\r\n");
  }
}

Result<void> Connection::Flush() {
  if (broken_) return std::unexpected(Broken("the connection broke earlier", "reusing it"));
  return WriteAll(CommandDeadline());
}

Result<std::vector<Reply>> Connection::ReadAvailable() {
  if (auto read = ReadSome(); !read) return std::unexpected(read.error());
  std::vector<Reply> replies;
  for (;;) {
    void* raw = nullptr;
    if (redisReaderGetReply(reader_, &raw) != REDIS_OK) {
      return std::unexpected(Broken(reader_->errstr, "parsing a reply"));
    }
    if (raw == nullptr) break;
    replies.emplace_back(static_cast<redisReply*>(raw));
  }
  return replies;
}

bool Connection::ClosedByPeer() const {
  pollfd p{fd_, POLLIN, 0};
  const int n = poll(&p, 1, 0);
  if (n == 0) return false;
  if (n < 0 || ssl_ == nullptr || (p.revents & (POLLERR | POLLHUP)) != 0) return true;
  // TLS: the bytes may be a record without data (a session ticket). Look
  // without taking: data nobody asked for, or an error, mean closed.
  char c;
  ERR_clear_error();
  const int r = SSL_peek(ssl_, &c, 1);
  const bool closed = r > 0 || SSL_get_error(ssl_, r) != SSL_ERROR_WANT_READ;
  ERR_clear_error();
  return closed;
}

}  // namespace idem::redis

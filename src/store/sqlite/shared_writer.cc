#include "shared_writer.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <system_error>
#include <utility>

#include "database_file.h"
#include "writer_protocol.h"

namespace idem::sqlite {
namespace {

// The first frame a client sends, and the server's answer to it.
constexpr std::string_view kHello = "idemgate sqlite shared writer";
constexpr std::string_view kWelcome = "\x01";

// A frame is a 32-bit little-endian length and that many bytes. No call or
// reply of a store write comes near this; a longer frame ends the connection.
constexpr uint32_t kMaxFrame = 1u << 30;

// After a failed connect, how long a client writes itself before trying
// again (a connect to a dead socket costs a syscall, not a wait).
constexpr auto kRetryAfterFailure = std::chrono::milliseconds(100);
// After a reply timed out, how many reply timeouts it writes itself.
constexpr int kTimeoutsAvoided = 10;
// After a server refused the hello (another idemgate build serves), how long
// it writes itself before asking again.
constexpr auto kRetryAfterRefusal = std::chrono::seconds(10);

int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool SendAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// Fills `data`; false at the end of the stream, on an error, or when the
// socket's receive timeout passed (then *timed_out is set).
bool RecvAll(int fd, char* data, size_t size, bool* timed_out) {
  while (size > 0) {
    const ssize_t n = ::recv(fd, data, size, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) *timed_out = true;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// `body` with its length before it.
std::string Frame(std::string_view body) {
  const auto n = static_cast<uint32_t>(body.size());
  std::string frame;
  frame.reserve(4 + body.size());
  for (int i = 0; i < 4; ++i) frame.push_back(static_cast<char>(n >> (8 * i)));
  frame.append(body);
  return frame;
}

bool WriteFrame(int fd, std::string_view body) {
  if (body.size() > kMaxFrame) return false;
  const std::string frame = Frame(body);
  return SendAll(fd, frame.data(), frame.size());
}

// One recv() brings in the length and, for a call or reply of a usual size,
// the whole body; the rest, if any, follows in as many as it takes. Each
// connection carries one call at a time, so nothing follows the frame.
// nullopt as RecvAll's false, or for a frame too long.
std::optional<std::string> ReadFrame(int fd, bool* timed_out) {
  constexpr size_t kFirst = 16 * 1024;
  std::string frame(kFirst, '\0');
  size_t have = 0;
  while (have < 4) {
    const ssize_t n = ::recv(fd, frame.data() + have, kFirst - have, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) *timed_out = true;
    if (n <= 0) return std::nullopt;
    have += static_cast<size_t>(n);
  }
  const auto* len = reinterpret_cast<const unsigned char*>(frame.data());
  const uint32_t size =
      len[0] | (len[1] << 8) | (len[2] << 16) | (static_cast<uint32_t>(len[3]) << 24);
  if (size > kMaxFrame || have > 4 + size) return std::nullopt;
  frame.resize(4 + size);
  if (!RecvAll(fd, frame.data() + have, frame.size() - have, timed_out)) return std::nullopt;
  frame.erase(0, 4);
  return frame;
}

std::string Hello() {
  std::string hello(kHello);
  for (int i = 0; i < 4; ++i) hello.push_back(static_cast<char>(wire::kProtocolVersion >> (8 * i)));
  return hello;
}

// Fills `addr` with `path`; false if the path does not fit in sun_path.
bool SocketAddress(const std::string& path, sockaddr_un& addr) {
  std::memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) return false;
  std::memcpy(addr.sun_path, path.data(), path.size());
  return true;
}

// Whether the process at the other end of `fd` runs as this process's user:
// the socket's mode already says so, this holds even if the mode was changed.
bool SameUser(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  return ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == ::geteuid();
}

}  // namespace

std::string SharedWriterSocketPath(const std::string& database_path) {
  return database_path + "-writer.sock";
}

std::string SharedWriterLockPath(const std::string& database_path) {
  return database_path + "-writer.lock";
}

Result<std::unique_ptr<SharedWriter>> SharedWriter::Open(const std::string& database_path,
                                                         Handler handler, size_t max_clients,
                                                         std::chrono::milliseconds reply_timeout) {
  const std::string lock_path = SharedWriterLockPath(database_path);
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return std::unexpected(ErrorFromErrno(errno, lock_path, "opening the shared writer's lock"));
  }
  std::string socket_path = SharedWriterSocketPath(database_path);
  // The server binds PATH-writer.sock.PID.tmp first (TryToServe).
  if (socket_path.size() + 16 >= sizeof(sockaddr_un::sun_path)) {
    static std::once_flag said;
    std::call_once(said, [&] {
      std::fprintf(stderr,
                   "idemgate: sqlite store %s: the path is too long for the shared writer's Unix "
                   "socket (%zu bytes, at most %zu); the processes on this file commit their "
                   "writes each on its own. A shorter path shares them.\n",
                   database_path.c_str(), socket_path.size(), sizeof(sockaddr_un::sun_path) - 17);
    });
  }
  std::unique_ptr<SharedWriter> writer(
      new SharedWriter(std::move(socket_path), fd, std::move(handler), max_clients, reply_timeout));
  writer->TryToServe();
  return writer;
}

SharedWriter::SharedWriter(std::string socket_path, int lock_fd, Handler handler,
                           size_t max_clients, std::chrono::milliseconds reply_timeout)
    : socket_path_(std::move(socket_path)),
      lock_fd_(lock_fd),
      handler_(std::move(handler)),
      max_clients_(max_clients),
      reply_timeout_(reply_timeout) {}

SharedWriter::~SharedWriter() {
  {
    std::lock_guard g(conns_mu_);
    stopping_ = true;
  }
  if (acceptor_.joinable()) {
    ::shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
    acceptor_.join();
    // Removed while the flock is still held, so it cannot be a successor's.
    ::unlink(socket_path_.c_str());
    ::close(listen_fd_);
  }
  {
    // Ends each connection's next read. A call already handed to the
    // writer is still answered: its reply holds the socket open.
    std::lock_guard g(conns_mu_);
    for (Conn& c : conns_) ::shutdown(c.socket->fd, SHUT_RD);
  }
  for (Conn& c : conns_) c.thread.join();
  conns_.clear();
  for (int fd : idle_) ::close(fd);
  ::close(lock_fd_);  // releases the flock: another process may serve now
}

void SharedWriter::TryToServe() {
  std::lock_guard g(conns_mu_);
  if (serving() || stopping_) return;
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) return;  // another process serves
  // Bound under a name of its own, then renamed into place: a client never
  // connects to a socket that is not listening yet.
  const std::string temp = socket_path_ + "." + std::to_string(::getpid()) + ".tmp";
  sockaddr_un addr;
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool ok = fd >= 0 && SocketAddress(temp, addr);
  if (ok) {
    ::unlink(temp.c_str());
    ok = ::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0 &&
         ::chmod(temp.c_str(), 0600) == 0 && ::listen(fd, SOMAXCONN) == 0 &&
         ::rename(temp.c_str(), socket_path_.c_str()) == 0;
    if (!ok) ::unlink(temp.c_str());
  }
  if (!ok) {
    // A path too long for a socket, a directory that refuses it: every
    // process then writes itself, as without a shared writer.
    if (fd >= 0) ::close(fd);
    ::flock(lock_fd_, LOCK_UN);
    return;
  }
  listen_fd_ = fd;
  serving_.store(true, std::memory_order_release);
  acceptor_ = std::thread([this] { Accept(); });
}

void SharedWriter::Accept() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    std::lock_guard g(conns_mu_);
    if (stopping_) {
      if (fd >= 0) ::close(fd);
      return;
    }
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // Out of file descriptors or memory: the client that was not accepted
      // finds its connect refused, or times out in the backlog, and writes
      // itself. Try again with the next one.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) continue;
      return;
    }
    // Reap the threads of connections that ended.
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (!it->done) {
        ++it;
        continue;
      }
      it->thread.join();
      it = conns_.erase(it);
    }
    if (!SameUser(fd) || conns_.size() >= max_clients_) {
      ::close(fd);
      continue;
    }
    Conn& c = conns_.emplace_back(Conn{std::make_shared<Socket>(fd), {}});
    c.thread = std::thread([this, &c] {
      Serve(c.socket);
      std::lock_guard done(conns_mu_);
      c.done = true;
    });
  }
}

SharedWriter::Socket::~Socket() { ::close(fd); }

void SharedWriter::SendReply(const std::shared_ptr<Socket>& socket, std::string reply) {
  std::string frame = Frame(reply);
  size_t sent = 0;
  while (sent < frame.size()) {
    const ssize_t n =
        ::send(socket->fd, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n <= 0) return;  // the client has gone: nobody to answer
    sent += static_cast<size_t>(n);
  }
  if (sent == frame.size()) return;
  auto rest = [socket, frame = std::move(frame), sent] {
    SendAll(socket->fd, frame.data() + sent, frame.size() - sent);
  };
  try {
    std::thread(rest).detach();
  } catch (const std::system_error&) {
    rest();  // no thread to be had: the writer sends it, blocking
  }
}

void SharedWriter::Serve(const std::shared_ptr<Socket>& socket) {
  const int fd = socket->fd;
  bool timed_out = false;  // the server's sockets have no timeout
  auto hello = ReadFrame(fd, &timed_out);
  if (!hello || *hello != Hello()) {
    WriteFrame(fd, std::string_view("\0", 1));
    return;
  }
  if (!WriteFrame(fd, kWelcome)) return;
  // The client sends its next call only once it has this one's reply, so the
  // read below waits while the writer runs the call, and nothing else writes
  // to the socket meanwhile.
  while (auto call = ReadFrame(fd, &timed_out)) {
    served_.fetch_add(1, std::memory_order_relaxed);
    handler_(*call, [socket](std::string reply) { SendReply(socket, std::move(reply)); });
  }
}

int SharedWriter::Connect() {
  {
    std::lock_guard g(idle_mu_);
    if (!idle_.empty()) {
      const int fd = idle_.back();
      idle_.pop_back();
      return fd;
    }
    if (SteadyNanos() < retry_after_ns_) return -1;
  }
  sockaddr_un addr;
  const auto secs = std::chrono::duration_cast<std::chrono::seconds>(reply_timeout_);
  const timeval timeout{
      static_cast<time_t>(secs.count()),
      static_cast<suseconds_t>(
          std::chrono::duration_cast<std::chrono::microseconds>(reply_timeout_ - secs).count())};
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool ok = fd >= 0 && SocketAddress(socket_path_, addr) &&
            ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout) == 0 &&
            ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0 &&
            WriteFrame(fd, Hello());
  bool timed_out = false;
  bool refused = false;
  if (ok) {
    auto welcome = ReadFrame(fd, &timed_out);
    ok = welcome && *welcome == kWelcome;
    refused = welcome && !ok;
  }
  if (ok) return fd;
  if (fd >= 0) ::close(fd);
  Avoid(timed_out ? std::chrono::nanoseconds(reply_timeout_ * kTimeoutsAvoided)
        : refused ? std::chrono::nanoseconds(kRetryAfterRefusal)
                  : std::chrono::nanoseconds(kRetryAfterFailure));
  return -1;
}

void SharedWriter::Avoid(std::chrono::nanoseconds pause) {
  std::lock_guard g(idle_mu_);
  retry_after_ns_ = SteadyNanos() + pause.count();
}

void SharedWriter::PutBack(int fd) {
  std::lock_guard g(idle_mu_);
  idle_.push_back(fd);
}

std::optional<Result<std::string>> SharedWriter::Call(std::string_view call) {
  // Twice: an idle connection may be to a server that has gone since.
  for (int attempt = 0; attempt < 2 && !serving(); ++attempt) {
    const int fd = Connect();
    if (fd < 0) break;
    if (!WriteFrame(fd, call)) {  // refused whole: the server had gone
      ::close(fd);
      continue;
    }
    sent_.fetch_add(1, std::memory_order_relaxed);
    bool timed_out = false;
    auto reply = ReadFrame(fd, &timed_out);
    if (!reply) {
      ::close(fd);
      if (timed_out) {
        // A stopped server: its idle connections would hang the same way.
        Avoid(reply_timeout_ * kTimeoutsAvoided);
        std::lock_guard g(idle_mu_);
        for (int idle : idle_) ::close(idle);
        idle_.clear();
      } else {
        TryToServe();
      }
      return Result<std::string>(std::unexpected(
          Error{ErrorCode::kUnavailable,
                timed_out ? "sqlite store: the process serving the file's writes did not answer in "
                            "time; the write may or may not be made"
                          : "sqlite store: the process serving the file's writes went away before "
                            "answering; the write may or may not have been made"}));
    }
    PutBack(fd);
    return std::move(*reply);
  }
  TryToServe();
  return std::nullopt;
}

}  // namespace idem::sqlite

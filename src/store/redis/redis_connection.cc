#include "redis_connection.h"

#include <poll.h>
#include <sys/time.h>

#include <cerrno>

namespace idem::redis {
namespace {

timeval ToTimeval(Duration d) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(d.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((d.count() % 1000) * 1000);
  return tv;
}

void AppendArgv(redisContext* ctx, const Command& cmd) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  argv.reserve(cmd.size());
  lens.reserve(cmd.size());
  for (const std::string& a : cmd) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  redisAppendCommandArgv(ctx, static_cast<int>(argv.size()), argv.data(), lens.data());
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

Result<std::unique_ptr<Connection>> Connection::Open(const NodeAddress& node,
                                                     const ConnectOptions& options) {
  redisContext* ctx =
      redisConnectWithTimeout(node.host.c_str(), node.port, ToTimeval(options.connect_timeout));
  if (ctx == nullptr || ctx->err) {
    std::string why = ctx ? ctx->errstr : "out of memory";
    if (ctx) redisFree(ctx);
    if (why.find("temporarily unavailable") != std::string::npos ||
        why.find("timed out") != std::string::npos) {
      why = "no answer within the connect timeout of " + DescribeDuration(options.connect_timeout);
    }
    return MakeError(ErrorCode::kUnavailable, "redis store " + node.ToString() +
                                                  " is unreachable: " + why +
                                                  "; retryable once the server is back");
  }
  redisSetTimeout(ctx, ToTimeval(options.command_timeout));
  redisEnableKeepAlive(ctx);
  std::unique_ptr<Connection> conn(new Connection(ctx, node, options.command_timeout));

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

Connection::~Connection() { redisFree(ctx_); }

Error Connection::IoError(std::string_view doing) {
  broken_ = true;
  std::string why = ctx_->errstr;
  if (ctx_->err == REDIS_ERR_IO &&
      (why.find("temporarily unavailable") != std::string::npos || why.empty())) {
    why = "no reply within the command timeout of " + DescribeDuration(command_timeout_);
  } else if (ctx_->err == REDIS_ERR_EOF) {
    why = "the server closed the connection";
  }
  return Error{ErrorCode::kUnavailable, "redis store " + node_.ToString() + ": " + why + " while " +
                                            std::string(doing) + "; retryable"};
}

Result<std::vector<Reply>> Connection::Pipeline(std::span<const Command> commands) {
  if (broken_) return std::unexpected(IoError("reusing a broken connection"));
  for (const Command& c : commands) AppendArgv(ctx_, c);
  std::vector<Reply> replies;
  replies.reserve(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) {
    void* raw = nullptr;
    if (redisGetReply(ctx_, &raw) != REDIS_OK || raw == nullptr) {
      return std::unexpected(IoError("running " + (commands[i].empty() ? "" : commands[i][0])));
    }
    replies.emplace_back(static_cast<redisReply*>(raw));
  }
  return replies;
}

Result<Reply> Connection::Run(const Command& command) {
  auto replies = Pipeline(std::span<const Command>(&command, 1));
  if (!replies) return std::unexpected(replies.error());
  return std::move(replies->front());
}

void Connection::Append(const Command& command) { AppendArgv(ctx_, command); }

Result<void> Connection::Flush() {
  int done = 0;
  while (!done) {
    if (redisBufferWrite(ctx_, &done) != REDIS_OK) return std::unexpected(IoError("writing"));
  }
  return {};
}

Result<std::vector<Reply>> Connection::ReadAvailable() {
  if (redisBufferRead(ctx_) != REDIS_OK) return std::unexpected(IoError("reading"));
  std::vector<Reply> replies;
  for (;;) {
    void* raw = nullptr;
    if (redisGetReplyFromReader(ctx_, &raw) != REDIS_OK) {
      return std::unexpected(IoError("parsing a reply"));
    }
    if (raw == nullptr) break;
    replies.emplace_back(static_cast<redisReply*>(raw));
  }
  return replies;
}

bool Connection::ClosedByPeer() const {
  pollfd p{ctx_->fd, POLLIN, 0};
  int n = poll(&p, 1, 0);
  return n != 0;  // readable (EOF / unexpected bytes), hung up, or poll failed
}

}  // namespace idem::redis

#include "fronts/mcp/http_reply.h"

#include "fronts/mcp/http_jsonrpc.h"
#include "fronts/mcp/sse.h"

namespace idem::mcp {

HttpReply::HttpReply(http::Responder respond, Mode mode, std::chrono::milliseconds keepalive,
                     std::string session_id)
    : mode_(mode),
      keepalive_(keepalive),
      session_id_(std::move(session_id)),
      respond_(std::move(respond)) {}

void HttpReply::Bind(const std::shared_ptr<ServerSession>& session,
                     const std::shared_ptr<Exchange>& exchange) {
  std::lock_guard lock(mu_);
  session_ = session;
  exchange_ = exchange;
}

void HttpReply::Open() {
  std::unique_lock lock(mu_);
  if (!respond_ || mode_ == Mode::kJson) return;
  Flush(lock);
}

void HttpReply::Event(std::string message) {
  std::unique_lock lock(mu_);
  if (done_) return;
  queued_ += FormatSseEvent(message);
  Flush(lock);
}

void HttpReply::End() {
  std::unique_lock lock(mu_);
  if (done_) return;
  ended_ = true;
  Flush(lock);
}

void HttpReply::Final(std::string message) {
  std::unique_lock lock(mu_);
  if (done_) return;
  if (respond_ && (mode_ == Mode::kHeld || mode_ == Mode::kHeldJson)) {
    // Nothing streamed before the final answer: one whole response.
    if (mode_ == Mode::kHeldJson) {
      const int status = StatelessHttpStatus(message);  // before the message moves
      return SendWhole(lock, Whole(status, "application/json", std::move(message)));
    }
    http::Response r = Whole(200, "text/event-stream", FormatSseEvent(message));
    r.headers.push_back({"Cache-Control", "no-cache"});
    return SendWhole(lock, std::move(r));
  }
  queued_ += FormatSseEvent(message);
  ended_ = true;
  Flush(lock);
}

void HttpReply::Json(std::string body) {
  // A header that does not match the body is a 400 in every dialect
  // (SEP-2243); other errors keep 200 outside 2026-07-28.
  const int status = StatelessHttpStatus(body) == 400 ? 400 : 200;
  http::Response r = Whole(status, "application/json", std::move(body));
  std::unique_lock lock(mu_);
  SendWhole(lock, std::move(r));
}

void HttpReply::Refuse(http::Response response) {
  std::unique_lock lock(mu_);
  SendWhole(lock, std::move(response));
}

void HttpReply::SendWhole(std::unique_lock<std::mutex>& lock, http::Response response) {
  if (done_ || !respond_) return;
  http::Responder respond = std::move(*respond_);
  respond_.reset();
  done_ = true;
  lock.unlock();
  respond(std::move(response));
}

void HttpReply::Next(std::function<void(Piece)> next) {
  std::unique_lock lock(mu_);
  if (queued_.empty() && !ended_) {
    next_ = std::move(next);
    return;
  }
  Piece piece{std::move(queued_), ended_, false};
  queued_.clear();
  if (ended_) done_ = true;
  lock.unlock();
  next(std::move(piece));
}

void HttpReply::Flush(std::unique_lock<std::mutex>& lock) {
  if (respond_) {
    // The stream's header goes out now; the listener then asks for events.
    http::Responder respond = std::move(*respond_);
    respond_.reset();
    lock.unlock();
    return respond(StreamHeader());
  }
  if (!next_ || (queued_.empty() && !ended_)) return;
  std::function<void(Piece)> next = std::move(next_);
  next_ = nullptr;
  Piece piece{std::move(queued_), ended_, false};
  queued_.clear();
  if (ended_) done_ = true;
  lock.unlock();
  next(std::move(piece));
}

void HttpReply::Detach() {
  std::shared_ptr<ServerSession> session;
  std::shared_ptr<Exchange> exchange;
  {
    std::lock_guard lock(mu_);
    done_ = true;
    next_ = nullptr;
    session = session_.lock();
    exchange = exchange_.lock();
  }
  if (session && exchange) session->Detach(exchange);
}

http::Response HttpReply::StreamHeader() {
  http::Response r;
  r.headers = {{"Content-Type", "text/event-stream"},
               {"Cache-Control", "no-cache"},
               {"X-Accel-Buffering", "no"}};
  if (!session_id_.empty()) r.headers.push_back({"Mcp-Session-Id", session_id_});
  r.stream = shared_from_this();
  r.idle_interval = keepalive_;
  r.idle_piece = FormatSseComment("keep-alive");
  return r;
}

http::Response HttpReply::Whole(int status, std::string content_type, std::string body) {
  http::Response r;
  r.status = status;
  r.headers.reserve(3);  // with Final's Cache-Control: no reallocation
  r.headers.push_back({"Content-Type", std::move(content_type)});
  if (!session_id_.empty()) r.headers.push_back({"Mcp-Session-Id", session_id_});
  r.body = std::move(body);
  return r;
}

}  // namespace idem::mcp

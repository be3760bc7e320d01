// One pending answer of the MCP endpoint (docs/DESIGN.md §6.1): a POST waiting
// for its answers, or the GET stream. The session writes to it as a
// StreamSink; the HTTP listener (net/http_listener.h) reads its SSE events as
// a BodySource once the stream's header is out.
//
// A POST of one request is held: nothing is sent until it has something to
// say. If that is the final answer, it goes out as one whole response with a
// Content-Length (text/event-stream with the one event, or, in the stateless
// dialect for a client that accepts it, plain JSON with the status MCP
// 2026-07-28 gives the answer); anything else, or Open() (one keep-alive
// interval passed), opens the chunked SSE stream. A stream that is quiet for
// a keep-alive interval gets an SSE comment from the listener.
//
// Thread-safe: the session calls the sink from its threads, the listener the
// source from its I/O thread. Callbacks into the listener are made without
// the reply's lock held.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "fronts/mcp/http_server_session.h"
#include "net/http_listener.h"

namespace idem::mcp {

class HttpReply : public StreamSink,
                  public http::BodySource,
                  public std::enable_shared_from_this<HttpReply> {
 public:
  enum class Mode {
    kStream,    // SSE; the header goes out at the first event (or Open)
    kHeld,      // SSE, but a final answer alone goes out whole
    kHeldJson,  // as kHeld, the final answer alone as plain JSON
    kJson,      // one JSON body (Json)
  };
  // `respond` answers the request; `keepalive` is the SSE keep-alive
  // interval (zero: none); `session_id` is sent as Mcp-Session-Id when not
  // empty (the answer to initialize).
  HttpReply(http::Responder respond, Mode mode, std::chrono::milliseconds keepalive,
            std::string session_id);

  // The exchange this reply answers: Cancel and ClientGone detach it from
  // its session so that later answers for it are dropped.
  void Bind(const std::shared_ptr<ServerSession>& session, const std::shared_ptr<Exchange>& exchange);
  // Sends the SSE stream's header now if it has not gone out yet.
  void Open();
  // The client left before the answer was written.
  void ClientGone() { Detach(); }
  // Sends `response` as the whole answer (a refusal), if nothing went out yet.
  void Refuse(http::Response response);

  // StreamSink (the session's side).
  void Event(std::string message) override;
  void End() override;
  void Final(std::string message) override;
  void Json(std::string body) override;

  // BodySource (the listener's side).
  void Next(std::function<void(Piece)> next) override;
  void Cancel() override { Detach(); }

 private:
  // Opens the stream if its header is still to go, else hands what is
  // queued to a waiting Next. Unlocks `lock`.
  void Flush(std::unique_lock<std::mutex>& lock);
  // Sends `response` as the whole answer if nothing went out yet. Unlocks `lock`.
  void SendWhole(std::unique_lock<std::mutex>& lock, http::Response response);
  void Detach();
  http::Response StreamHeader();
  http::Response Whole(int status, std::string content_type, std::string body);

  const Mode mode_;
  const std::chrono::milliseconds keepalive_;
  const std::string session_id_;

  std::mutex mu_;
  std::optional<http::Responder> respond_;  // until the header goes out
  std::string queued_;                      // SSE events not yet handed to the listener
  bool ended_ = false;                      // the stream ends after queued_
  bool done_ = false;                       // nothing more is accepted
  std::function<void(Piece)> next_;         // a Next waiting for events
  std::weak_ptr<ServerSession> session_;
  std::weak_ptr<Exchange> exchange_;
};

}  // namespace idem::mcp

// The thread on which an HTTP channel delivers its messages.
//
// Channel promises that on_message runs on the channel's own thread, in order
// of arrival, and on_closed once after the last on_message. The HTTP
// transports receive on shared I/O threads, which must never block on a
// handler (a handler may wait seconds for a ledger outcome), so each channel
// hands its messages to a MessagePump: one thread, one FIFO of messages and
// tasks.
//
// Thread-safe: Push, Post and Close may be called from any thread. The
// destructor may run on the pump's own thread (a handler that drops the last
// reference to its channel); the thread is then detached and touches nothing
// but state it owns.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace idem::mcp {

class MessagePump {
 public:
  using OnMessage = std::function<void(std::string message)>;
  using OnClosed = std::function<void(std::string reason)>;

  MessagePump();
  ~MessagePump();
  MessagePump(const MessagePump&) = delete;
  MessagePump& operator=(const MessagePump&) = delete;

  // Sets the handlers and starts delivering queued messages. Messages pushed
  // before Start wait for it. A second call is ignored.
  void Start(OnMessage on_message, OnClosed on_closed);
  // Queues a message. False once Close was called.
  bool Push(std::string message);
  // Queues a task to run on the pump thread, in FIFO order with messages; it
  // does not wait for Start. False once Close was called.
  bool Post(std::function<void()> task);
  // No more messages: after the queued ones are delivered, on_closed(reason)
  // runs once (if Start was called; otherwise queued messages are dropped).
  // Idempotent: the first reason wins.
  void Close(std::string reason);
  // True once Close was called.
  bool closed() const;

 private:
  struct State;
  static void Run(std::shared_ptr<State> state);

  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace idem::mcp

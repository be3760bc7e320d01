#include "fronts/mcp/http_message_pump.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <variant>

namespace idem::mcp {

struct MessagePump::State {
  std::mutex mu;
  std::condition_variable cv;
  // A message (string) or a task.
  std::deque<std::variant<std::string, std::function<void()>>> queue;
  OnMessage on_message;
  OnClosed on_closed;
  bool started = false;
  bool closing = false;    // Close was called
  bool abandoned = false;  // the owner is gone: stop without calling on_closed
  std::string reason;
};

MessagePump::MessagePump() : state_(std::make_shared<State>()) {
  thread_ = std::thread(&MessagePump::Run, state_);
}

MessagePump::~MessagePump() {
  {
    std::lock_guard lock(state_->mu);
    if (!state_->closing) {
      state_->closing = true;
      state_->reason = "channel destroyed";
    }
    state_->abandoned = true;
    state_->cv.notify_all();
  }
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();
  } else if (thread_.joinable()) {
    thread_.join();
  }
}

void MessagePump::Start(OnMessage on_message, OnClosed on_closed) {
  std::lock_guard lock(state_->mu);
  if (state_->started) return;
  state_->started = true;
  state_->on_message = std::move(on_message);
  state_->on_closed = std::move(on_closed);
  state_->cv.notify_all();
}

bool MessagePump::Push(std::string message) {
  std::lock_guard lock(state_->mu);
  if (state_->closing) return false;
  state_->queue.emplace_back(std::move(message));
  state_->cv.notify_all();
  return true;
}

bool MessagePump::Post(std::function<void()> task) {
  std::lock_guard lock(state_->mu);
  if (state_->closing) return false;
  state_->queue.emplace_back(std::move(task));
  state_->cv.notify_all();
  return true;
}

void MessagePump::Close(std::string reason) {
  std::lock_guard lock(state_->mu);
  if (state_->closing) return;
  state_->closing = true;
  state_->reason = std::move(reason);
  state_->cv.notify_all();
}

bool MessagePump::closed() const {
  std::lock_guard lock(state_->mu);
  return state_->closing;
}

void MessagePump::Run(std::shared_ptr<State> s) {
  std::unique_lock lock(s->mu);
  while (true) {
    // A task at the front runs at once; a message waits for Start unless the
    // pump is closing without ever being started (then it is dropped).
    s->cv.wait(lock, [&] {
      if (s->abandoned) return true;
      if (!s->queue.empty() &&
          (s->started || std::holds_alternative<std::function<void()>>(s->queue.front()) ||
           s->closing)) {
        return true;
      }
      return s->queue.empty() && s->closing;
    });
    if (s->abandoned) break;  // the owner is gone: deliver nothing more
    if (!s->queue.empty()) {
      auto item = std::move(s->queue.front());
      s->queue.pop_front();
      if (auto* task = std::get_if<std::function<void()>>(&item)) {
        lock.unlock();
        (*task)();
        lock.lock();
      } else if (s->started) {
        OnMessage& handler = s->on_message;
        lock.unlock();
        if (handler) handler(std::move(std::get<std::string>(item)));
        lock.lock();
      }
      continue;
    }
    // Closing and drained.
    if (s->started && s->on_closed) {
      OnClosed on_closed = std::move(s->on_closed);
      std::string reason = s->reason;
      s->on_message = nullptr;
      lock.unlock();
      on_closed(std::move(reason));
      lock.lock();
    }
    break;
  }
  // Release the handlers here, on the pump thread, so that objects they own
  // are destroyed outside the owner's lock.
  OnMessage on_message = std::move(s->on_message);
  OnClosed on_closed = std::move(s->on_closed);
  lock.unlock();
}

}  // namespace idem::mcp

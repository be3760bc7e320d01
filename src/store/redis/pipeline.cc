#include "pipeline.h"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <deque>
#include <future>
#include <iterator>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

namespace idem::redis {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

// Everything the pipeline's handlers touch, shared with them so that a
// handler still queued after the Pipeline is gone finds it alive (it then
// sees `closed` and does nothing).
struct Pipeline::State : std::enable_shared_from_this<State> {
  using Queued = std::pair<Command, Done>;

  State(NodeAddress n, ConnectOptions o, std::shared_ptr<ConnectBackoff> b, asio::io_context& io)
      : node(std::move(n)),
        options(std::move(o)),
        backoff(b ? std::move(b) : std::make_shared<ConnectBackoff>()),
        strand(asio::make_strand(io)),
        timer(strand) {}

  // `unreached`: the command was never written, because no connection
  // could be made (Error::unreached, which on_store_down = "pass" needs, as
  // on the blocking path).
  Error Failure(std::string_view what, bool unreached = false) const {
    return Error{ErrorCode::kUnavailable,
                 "redis store: pipelined command to " + node.ToString() +
                     " failed: " + std::string(what),
                 unreached};
  }

  // Any thread.
  void Enqueue(const std::function<Command()>& make, Done done);

  // On the strand.
  void Turn();
  void Send(std::vector<Queued> batch);
  void Connect();
  void Connected(Result<std::unique_ptr<Connection>> opened);
  void Watch();
  void Readable(uint64_t generation, const boost::system::error_code& ec);
  void Time();
  void Timed(const boost::system::error_code& ec);
  void FailAll(const Error& e);
  void Close();

  const NodeAddress node;
  const ConnectOptions options;
  const std::shared_ptr<ConnectBackoff> backoff;
  const asio::strand<asio::io_context::executor_type> strand;

  std::mutex mu;
  std::vector<Queued> queued;  // guarded by mu
  bool turn_due = false;       // guarded by mu: a Turn is scheduled
  bool closing = false;        // guarded by mu

  // On the strand only.
  std::unique_ptr<Connection> conn;
  // Watches conn's socket for replies (and for the server closing it while
  // idle). Released, never closed: conn owns the socket.
  std::optional<asio::posix::stream_descriptor> socket;
  uint64_t generation = 0;       // of `socket`: a wait for an earlier one is stale
  bool reading = false;          // a wait on `socket` is pending
  asio::steady_timer timer;      // the command timeout
  bool timing = false;           // a wait on `timer` is pending
  std::deque<Done> in_flight;    // in the order the commands were written
  Clock::time_point progress{};  // the last write or reply while replies were due
  std::vector<Queued> waiting;   // queued while the connection opens
  bool connecting = false;
  bool closed = false;
  // Opens the connection (Connection::Open waits up to the connect
  // timeout). Joined before the next one starts and by ~Pipeline.
  std::thread connector;
};

void Pipeline::State::Enqueue(const std::function<Command()>& make, Done done) {
  bool open = false, schedule = false;
  {
    std::lock_guard g(mu);
    if (!closing) {
      open = true;
      schedule = !turn_due;  // else a Turn is due to take the queue
      turn_due = true;
      queued.emplace_back(make(), std::move(done));
    }
  }
  if (!open) return done(std::unexpected(Failure("the store is closing")));
  // Posted, not deferred: the first thread free writes the command (with
  // whatever else is queued by then), rather than this one after its
  // handler and everything queued before (Pipeline's comment).
  if (schedule) asio::post(strand, [self = shared_from_this()] { self->Turn(); });
}

void Pipeline::State::Turn() {
  std::vector<Queued> batch;
  {
    std::lock_guard g(mu);
    batch.swap(queued);
    turn_due = false;
  }
  if (closed) {
    const Error e = Failure("the store is closing");
    for (Queued& q : batch) q.second(std::unexpected(e));
    return;
  }
  Send(std::move(batch));
}

void Pipeline::State::Send(std::vector<Queued> batch) {
  if (connecting) {
    std::move(batch.begin(), batch.end(), std::back_inserter(waiting));
    return;
  }
  if (!conn) {
    // After a failed connect, batches fail at once for the node's backoff,
    // so that a server that is down costs each call no connect timeout of
    // its own.
    if (std::optional<Error> unreached = backoff->Check()) {
      const Error e = Failure("cannot connect: " + unreached->message, unreached->unreached);
      for (Queued& q : batch) q.second(std::unexpected(e));
      return;
    }
    waiting = std::move(batch);
    Connect();
    return;
  }
  if (in_flight.empty()) progress = Clock::now();
  for (Queued& q : batch) {
    conn->Append(q.first);
    in_flight.push_back(std::move(q.second));
  }
  if (auto flushed = conn->Flush(); !flushed) return FailAll(flushed.error());
  Time();
}

void Pipeline::State::Connect() {
  connecting = true;
  if (connector.joinable()) connector.join();  // done: its Connected has run
  connector = std::thread([self = shared_from_this()] {
    auto opened = std::make_shared<Result<std::unique_ptr<Connection>>>(
        Connection::Open(self->node, self->options));
    asio::post(self->strand, [self, opened] { self->Connected(std::move(*opened)); });
  });
}

void Pipeline::State::Connected(Result<std::unique_ptr<Connection>> opened) {
  connecting = false;
  std::vector<Queued> batch = std::move(waiting);
  waiting.clear();
  if (closed) return;  // Close failed `waiting`; the connection just closes
  if (!opened) {
    backoff->Failed(opened.error());
    const Error e = Failure("cannot connect: " + opened.error().message, opened.error().unreached);
    for (Queued& q : batch) q.second(std::unexpected(e));
    return;
  }
  backoff->Reached();
  conn = std::move(*opened);
  socket.emplace(strand, conn->fd());
  ++generation;
  Watch();
  Send(std::move(batch));
}

void Pipeline::State::Watch() {
  if (reading || !socket) return;
  reading = true;
  socket->async_wait(asio::posix::stream_descriptor::wait_read,
                     [self = shared_from_this(), g = generation](boost::system::error_code ec) {
                       self->Readable(g, ec);
                     });
}

void Pipeline::State::Readable(uint64_t g, const boost::system::error_code& ec) {
  if (g != generation) return;  // a wait on a connection since dropped
  reading = false;
  if (ec) return FailAll(Failure("waiting for replies: " + ec.message()));
  auto replies = conn->ReadAvailable();
  if (!replies) return FailAll(replies.error());
  for (Reply& r : *replies) {
    if (in_flight.empty()) {  // a reply nobody asked for: the stream is lost
      return FailAll(Failure("unexpected reply"));
    }
    Done done = std::move(in_flight.front());
    in_flight.pop_front();
    done(std::move(r));
  }
  progress = Clock::now();
  Watch();
}

void Pipeline::State::Time() {
  if (timing || in_flight.empty()) return;
  timing = true;
  timer.expires_at(progress + options.command_timeout);
  timer.async_wait([self = shared_from_this()](boost::system::error_code ec) { self->Timed(ec); });
}

void Pipeline::State::Timed(const boost::system::error_code& ec) {
  if (ec == asio::error::operation_aborted) return;  // cancelled by Close
  timing = false;
  if (closed || in_flight.empty()) return;
  if (Clock::now() >= progress + options.command_timeout) {
    return FailAll(Failure("no reply within the command timeout"));
  }
  Time();  // replies came meanwhile: wait from the last one
}

void Pipeline::State::FailAll(const Error& e) {
  if (socket) {
    ++generation;
    socket->release();  // cancels the wait; conn closes the socket
    socket.reset();
  }
  reading = false;
  conn.reset();
  while (!in_flight.empty()) {
    Done done = std::move(in_flight.front());
    in_flight.pop_front();
    done(std::unexpected(e));
  }
}

void Pipeline::State::Close() {
  closed = true;
  const Error e = Failure("the store is closing");
  FailAll(e);
  std::vector<Queued> batch = std::move(waiting);
  waiting.clear();
  for (Queued& q : batch) q.second(std::unexpected(e));
  timer.cancel();
  timing = false;
}

// ── Pipeline ────────────────────────────────────────────────────────────────

// The io_context and thread of a pipeline that runs on its own.
struct Pipeline::OwnThread {
  asio::io_context io{1};
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  std::once_flag started;
  std::thread thread;
};

Pipeline::Pipeline(NodeAddress node, ConnectOptions options,
                   std::shared_ptr<ConnectBackoff> backoff, asio::io_context* io)
    : own_(io ? nullptr : std::make_unique<OwnThread>()),
      state_(std::make_shared<State>(std::move(node), std::move(options), std::move(backoff),
                                     io ? *io : own_->io)) {}

Pipeline::~Pipeline() {
  {
    std::lock_guard g(state_->mu);
    state_->closing = true;  // nothing more is queued
  }
  // A pipeline of its own whose thread never started has never run a
  // handler: there is nothing to close.
  if (!own_ || own_->thread.joinable()) {
    std::promise<void> closed;
    asio::post(state_->strand, [s = state_, &closed] {
      s->Close();
      closed.set_value();
    });
    closed.get_future().wait();
  }
  // Its Connected, if it was connecting, finds the pipeline closed.
  if (state_->connector.joinable()) state_->connector.join();
  if (own_ && own_->thread.joinable()) {
    own_->work.reset();  // run() returns once the last handler has run
    own_->thread.join();
  }
}

void Pipeline::Submit(Command command, Done done) {
  SubmitBuilt([&command] { return std::move(command); }, std::move(done));
}

void Pipeline::SubmitBuilt(const std::function<Command()>& make, Done done) {
  // A pipeline of its own starts its thread with the first command: a store
  // opened by a command that never uses it (inspect, audit) costs no thread.
  if (own_) {
    std::call_once(own_->started,
                   [o = own_.get()] { o->thread = std::thread([o] { o->io.run(); }); });
  }
  state_->Enqueue(make, std::move(done));
}

bool Pipeline::OnPipelineThread() const {
  return state_->strand.get_inner_executor().running_in_this_thread();
}

}  // namespace idem::redis

// One MCP proxy session (docs/DESIGN.md §6.1): binds one client Channel to one
// upstream Channel and gates the client's tools/call requests through a
// Ledger shared by the whole process.
//
// Everything it does not intercept passes through byte for byte in both
// directions, ids unchanged (initialize, server/discover, notifications,
// progress, cancellation, logging, resources, prompts, completion, ping,
// server-to-client requests and their responses). It intercepts:
//  - tools/list responses: each tool rewritten (tool_gate.h) so the model
//    knows which tools are safe to retry;
//  - tools/call on a gated tool: keyed, claimed in the ledger, forwarded with
//    the key in _meta, and its answer stored before the client sees it
//    (persist before acknowledging); retries are answered from the store;
//  - notifications/cancelled for a gated call (forwarded, and the call's
//    record becomes unknown if no answer follows within cancel_grace);
//  - its own reconcile lookups upstream (ids "idemgate-N"), whose answers
//    are consumed, not forwarded.
// When the upstream goes away, every request it did not answer gets a
// JSON-RPC error (for a gated call: outcome unknown, never "did not happen").
//
// Threads: each channel delivers on its own thread; gated calls run on the
// session's worker threads, because Ledger::Begin may wait (policy.wait) and
// the answer may take long; no lock is held while sending. All public
// methods are thread-safe.
//
// Life cycle: construct, Start(), Wait(), destroy. The session ends when the
// upstream has closed and every gated call has settled. It stops when the
// client leaves (end of input) or Stop() is called (a stop signal): from
// then on a tools/call is refused (kRpcStopping, retryable, nothing ran) and
// the calls in flight have [mcp] stop_grace, by the ledger's clock, to
// settle; a call still running after it is abandoned: its record is marked
// unknown (a late answer, before the upstream is gone, still settles it) and
// its client told outcome unknown. Then the upstream is closed: Close()
// after the client left (EOF, as without the proxy), CloseNow() after Stop()
// (its host is about to kill); the session waits for it to close (so an
// upstream Channel must call on_closed eventually after Close(), as
// ChildChannel does by killing a child that lingers). When the upstream
// closes first, the session answers what is pending and closes the client
// channel. Destroy the session before its channels, its Ledger and its
// Config, and never from inside one of its channels' callbacks: the
// destructor waits for running callbacks and workers; afterwards the
// channels may still call the functions Start() gave them, which then do
// nothing.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.h"
#include "idem/config.h"
#include "idem/ledger.h"
#include "fronts/mcp/channel.h"

namespace idem::mcp {

// Bounds how many gated tool calls are in flight (waiting in Begin or for
// the upstream). One budget may be shared by every session of a process.
// Thread-safe.
class CallBudget {
 public:
  explicit CallBudget(size_t max) : max_(max) {}
  // Takes one slot; false when all `max` are in use.
  bool TryAcquire();
  void Release();
  size_t max() const { return max_; }
  size_t in_use() const { return used_.load(); }

 private:
  const size_t max_;
  std::atomic<size_t> used_{0};
};

// What an upstream channel says about an error response it delivered: the
// tool's own answer, or one the channel synthesised because the request
// could not be delivered (the HTTP upstream's convention, http_channels.h).
enum class UpstreamDelivery {
  kAnswered,   // an ordinary response from the upstream
  kNotSent,    // the request never reached the upstream: nothing happened
  kMaybeSent,  // the request was sent but no answer came: outcome unknown
};

struct SessionOptions {
  // Tenant the session's records belong to. Empty: config.mcp.tenant. (An
  // HTTP front sets the tenant of the client's bearer token.)
  std::string tenant;
  // What the session's records are scoped to (idem::ScopedKey): a call is
  // answered only from a record made through the same upstream. The CLI
  // sets [mcp] scope, or the upstream's own scope (ScopeOfUpstream of its
  // command line or URL). Empty: unscoped.
  std::string scope;
  // The environment `env:` id sources of [mcp] turn_id, session_id and
  // call_id read. The CLI passes the process's; empty: none.
  SourceEnvironment env;
  // The turn file a hook:turn id source reads (host_turn.h: the prompt
  // hook's file for the host that started the proxy). The CLI sets it when
  // [mcp] turn_id has hook:turn and the hook directory is safe; empty:
  // hook:turn is never present.
  std::string hook_turn_file;
  // Gated calls in flight at once, past which a call is refused with a
  // retryable JSON-RPC error. Null: a budget of 256 for this session alone.
  std::shared_ptr<CallBudget> budget;
  // After the client cancels a forwarded gated call, how long to wait for the
  // tool's answer (by the ledger's clock) before the record is marked
  // unknown. An answer that comes later still settles the record. Default 30 s.
  Duration cancel_grace{30'000};
  // How long a reconcile lookup waits for the upstream's answer (by the
  // ledger's clock). Default 10 s.
  Duration reconcile_timeout{10'000};
  // One log line per gated call. Default off: only problems are logged.
  bool verbose = false;
  // Classifies error responses from the upstream channel (see
  // UpstreamDelivery). Null: every error response is the upstream's own (a
  // gated call's claim is then released).
  std::function<UpstreamDelivery(std::string_view response)> classify_delivery;
  // Called once when the session has ended (from one of its threads, so it
  // must not block or destroy the session; it may wake whoever will).
  std::function<void()> on_ended;
  // Called with DescribeGating's lines (tool_gate.h) each time the upstream
  // answers a tools/list, from a channel thread; it must not block. The CLI
  // prints them once per distinct list. Null: not called.
  std::function<void(const std::vector<std::string>& lines)> on_tools_listed;
  // Log sink, one line per call without newline (the CLI writes to stderr;
  // stdout carries only MCP messages). Called from any thread. Null: silent.
  std::function<void(std::string_view line)> log;
};

// How a session ended.
struct SessionEnd {
  bool upstream_closed_first = false;  // the upstream went away while the client was connected
  std::string upstream_reason;         // the upstream channel's on_closed reason
  std::string client_reason;           // the client channel's, if it closed
};

class McpSession {
 public:
  // `client`, `upstream`, `ledger` and `config` must outlive the session.
  McpSession(Channel& client, Channel& upstream, Ledger& ledger, const Config& config,
             SessionOptions options = {});
  ~McpSession();
  McpSession(const McpSession&) = delete;
  McpSession& operator=(const McpSession&) = delete;

  // Starts both channels. Call once.
  void Start();
  // Stops the session (see the life cycle above); returns at once, Wait()
  // then returns when it has ended. Idempotent; after the client left, it
  // makes the upstream's close a CloseNow().
  void Stop();
  // Blocks until the session has ended (see the life cycle above).
  SessionEnd Wait();
  // True once the session has ended; Wait() would not block.
  bool ended() const;

 private:
  class Core;
  std::shared_ptr<Core> core_;
};

}  // namespace idem::mcp

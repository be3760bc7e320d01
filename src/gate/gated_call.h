// The life of one gated call, written once for every front (docs/DESIGN.md
// §4.7): begin → answer what the ledger decided (gate::AnswerFor), or run
// under a lease → the front forwards and classifies its wire answer → settle
// (stored before anyone sees it) → the front renders the settled result →
// the verbose-log note.
//
// A front supplies only what it knows, as pingora's ProxyHttp does: one
// GatedFront per call (its context: the request, the responder, the wire
// answer) with phases the driver calls in order. The driver owns the order,
// the lease and every ledger write, so a front cannot answer before the
// outcome is stored, nor forget to release a claim.
//
// Two concurrency models:
//  - Threading::kContinuations (the HTTP proxy): nothing blocks the calling
//    thread. Begin goes through Ledger::BeginWithoutBlocking, completions
//    through CompleteAsync where the store has it, and every other store
//    write through GatedFront::Offload (a worker pool).
//  - Threading::kCallersThread (the MCP front, one worker thread per call):
//    Ledger::Begin and the settling writes run on the calling thread, which
//    may block; Forward may wait for the upstream there.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "gate/answer.h"
#include "gate/begin_failure.h"
#include "idem/ledger.h"

namespace idem::gate {

// What the upstream's answer (or the lack of one) means, as the front
// classified its wire answer (gate::ClassOfHttpStatus, ClassOfJsonRpcError).
struct Upstream {
  Execution::Kind kind = Execution::Kind::kSuccess;
  // kSuccess and kToolError: what is stored. The front may hand a kTooLarge
  // marker of its own (the proxy keeps the status and headers in it); the
  // ledger turns a body over max_result_bytes into one too.
  Outcome outcome;
  // An answer came back (the fault point after_answer is passed).
  bool answered = false;
};

// What settling an execution did, for the front to render.
struct Settled {
  enum class Kind {
    kStored,     // the outcome is stored: answer it
    kNotStored,  // an outcome the store refused (`error`): withhold it
    kReleased,   // nothing happened upstream (or errors = release): a retry runs
    kUnknown,    // the action may have happened: the record is unknown
  };
  Kind kind = Kind::kStored;
  std::optional<Error> error;  // kNotStored: why
};

// One gated call's front: its context and its phases. The driver calls the
// phases in order, never two at a time: Forward at most once, exactly one
// Render, then Finish (Offload as often as a store write needs a worker).
// The object lives until Finish has returned.
class GatedFront {
 public:
  virtual ~GatedFront() = default;

  // The call as the front planned it; it must not change while the driver runs.
  virtual const Call& call() const = 0;
  // kContinuations only: runs `work` (a store write that may block) on a
  // worker thread. False if it cannot (the front is stopping): the driver
  // then answers a begin with BeginFailure::kStopping, or runs a settling
  // write on the calling thread.
  virtual bool Offload(std::function<void()> work) = 0;
  // Sends the call upstream (the driver holds the lease meanwhile) and calls
  // `done` exactly once with what its answer means: on any thread in
  // kContinuations, on the calling thread in kCallersThread. Something that
  // kept the call from being sent is kNotSent.
  virtual void Forward(const Decision& d, std::function<void(Upstream)> done) = 0;
  // Each Render answers the client (or decides not to) and returns the note
  // for the verbose log; empty keeps the driver's.
  // The ledger's decision when it is not kRun: a replay or a refusal.
  virtual std::string RenderAnswer(const Decision& d, const Answer& a) = 0;
  // Begin failed: nothing ran.
  virtual std::string RenderBeginFailed(const BeginFailure& f) = 0;
  // The execution, settled.
  virtual std::string RenderSettled(const Decision& d, const Settled& s) = 0;
  // A line for the operator (a write the driver could not make), whatever
  // the verbose setting.
  virtual void Log(std::string line) = 0;
  // The end: the front logs `note` (if verbose) and drops its bookkeeping.
  // `d` is null when begin failed.
  virtual void Finish(std::string_view note, const Decision* d) = 0;
};

enum class Threading { kContinuations, kCallersThread };

// Runs a gated call from its begin.
void RunGatedCall(Ledger& ledger, std::shared_ptr<GatedFront> front, Threading threading);

// Runs a gated call from a decision the front already has (Ledger::AnswerHeld,
// or a failed begin).
void RunDecided(Ledger& ledger, std::shared_ptr<GatedFront> front, Threading threading,
                Result<Decision> begun);

// Settles one execution on the calling thread (which may block): the driver's
// kCallersThread step, and a front's own for a late answer to a call it gave
// up on (its record already unknown at `d`'s fence). Writes the driver cannot
// make are reported through `log`.
Settled SettleHere(Ledger& ledger, const Call& call, const Decision& d, Upstream up,
                   const std::function<void(std::string)>& log);

}  // namespace idem::gate

// The ledger API of `idemgate serve` (docs/DESIGN.md §6.3): HTTP/JSON steps of
// the record life cycle for agent runtimes that run tools in-process.
//
//   POST /v1/calls/begin         {turn_id?, tool, args?, key?, mode?, fields?}
//   POST /v1/calls/complete      {key, fence, outcome}
//   POST /v1/calls/release       {key, fence}
//   POST /v1/calls/heartbeat     {key, fence}
//   POST /v1/calls/mark_unknown  {key, fence}
//   GET    /v1/records/{key}          the record (its own tenant; admin: ?tenant=)
//   DELETE /v1/records/{key}          evict (admin)
//   POST   /v1/records/{key}/resolve  {release: true} | {outcome, force?} (admin)
//   GET    /v1/attempts?key=&tool=&outcome=&since=&limit=&tenant=
//
// Decisions are 200 JSON: begin answers {"decision":"execute", key, fence,
// lease_ms, lease_expires_at} or {"decision":"replay", "replayed":true, key,
// outcome, first_at, completed_at, attached, drift}. Conditions are RFC 9457
// problems, as the HTTP proxy answers them: in progress 409 + Retry-After,
// outcome unknown 409, drift 422, outcome too large 409, lost lease (stale
// fence) 409, no such record 404, store down 503 + Retry-After, bad input 400
// naming the field, wrong Content-Type 415.
//
// An outcome is {"status": "success" | "error", "result": <any JSON>}. It is
// stored byte for byte as sent and replayed as it was stored; "error" is a
// tool error (stored and replayed, or released when the tool's policy says
// errors = "release").
//
// Every record is scoped by the caller's tenant (Principal.tenant): the same
// key text from two tenants names two records.
//
// Thread-safe. Handle() runs on an I/O thread: it parses there; begin and
// complete reach the store without a worker where it allows
// (Ledger::BeginWithoutBlocking, ReadAsync, CompleteAsync: Redis, and its
// replay cache), and everything that may block (Begin waits up to
// policy.wait) runs on `pool`.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "core/worker_pool.h"
#include "net/http_listener.h"
#include "idem/config.h"
#include "idem/ledger.h"

namespace idem::http {

class LedgerApi {
 public:
  // `ledger`, `config` and `pool` must outlive every request handled.
  LedgerApi(Ledger& ledger, const Config& config, WorkerPool& pool);

  // Answers /v1/... requests; anything else is 404.
  void Handle(Request request, Responder respond);
  Handler handler() {
    return [this](Request r, Responder respond) { Handle(std::move(r), std::move(respond)); };
  }

 private:
  // /v1/calls/complete through Store::GetAsync and Ledger::CompleteAsync,
  // answering through `respond`; false if the store cannot read without
  // blocking (`respond` is not used: the caller completes on a worker).
  // Every step is bound to `owner_tag`, the tag of the client that began
  // the call (Call::owner_tag; 403 for another client's or front's record).
  bool CompleteWithoutBlocking(const RecordId& id, uint64_t fence, const std::string& owner_tag,
                               std::shared_ptr<const Outcome> outcome, const Responder& respond);
  // Runs `work` on the pool and answers what it returns; 503 when the pool is
  // stopping. `before_reply`: the answer passes that fault point first.
  void Offload(const Responder& respond, bool before_reply, std::function<Response()> work);

  // One handler per endpoint; each answers through `respond` exactly once.
  void HandleStep(Request& request, const Responder& respond);     // /v1/calls/{step}
  void Begin(Request& request, const Responder& respond);          // /v1/calls/begin
  // /v1/calls/complete, release, heartbeat, mark_unknown: parses the body
  // on the I/O thread, then SettleStep on a worker.
  void FenceStep(std::string step, Request& request, const Responder& respond);
  Response SettleStep(std::string_view step, const RecordId& id, uint64_t fence,
                      const std::string& owner_tag, const std::shared_ptr<Outcome>& outcome);
  void HandleRecord(Request& request, const Responder& respond);   // /v1/records/{key}
  void Resolve(Request& request, const RecordId& id, const Responder& respond);  // .../resolve
  void HandleAttempts(const Request& request, const Responder& respond);  // /v1/attempts

  Ledger& ledger_;
  const Config& config_;
  WorkerPool& pool_;
};

}  // namespace idem::http

// The operator console (docs/DESIGN.md §6.4): a small web page at /console on
// every HTTP front (`serve`, `http`, `mcp --listen`), for the records waiting
// as `unknown`, a record's page, the attempt log and the replay ratio per tool.
//
//   GET  /console, /console/console.js, /console/console.css   the page
//        (plain HTML, CSS and JavaScript embedded in the binary; served to
//        anyone: it holds no data and asks for an admin token)
//   GET  /console/api/whoami                    {tenant, admin}
//   GET  /console/api/unknown                   records waiting as unknown
//   GET  /console/api/record?tenant=&key=       one record, its outcome
//   GET  /console/api/attempts?tenant=&key=&tool=&outcome=&since=&limit=
//   GET  /console/api/replay?since=&tenant=     replay ratio per tool over time
//   POST /console/api/release     {tenant, key, fence}
//   POST /console/api/set-outcome {tenant, key, fence, class, body}
//   POST /console/api/evict       {tenant, key, fence?}
//
// Every /console/api/ request needs an admin token as Authorization: Bearer
// (401 without a valid token, 403 for a tenant without admin = true). The
// page keeps the token in sessionStorage and sends it as that header: no
// cookies, so another site cannot make the browser act; a POST must also be
// application/json, which a form cannot send, and any API request a browser
// marks as sent from another site or origin is refused 403
// (http::CrossSiteRefusal: without tokens every caller is admin). Release and set-outcome go through ResolveRecord
// (idem/resolve.h), conditional on the fence the operator saw; evict through
// EvictRecord; each is written to the audit log naming the admin tenant.
//
// The unknown list is derived from the audit log: the newest `unknown`
// entries ([console] scan_attempts), each key read once, the ones whose record
// is still unknown kept ([console] max_records). No store has a "records by
// state" query; every state change to unknown writes such an entry.
//
// Thread-safe. Store work runs on the console's own worker pool, never on an
// I/O thread.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/worker_pool.h"
#include "idem/config.h"
#include "idem/ledger.h"
#include "net/http_listener.h"

namespace idem::console {

class Console {
 public:
  // `ledger` and `config` must outlive the console; the console must outlive
  // every request handed to it (declare it before the listener).
  Console(Ledger& ledger, const Config& config);
  ~Console();

  // Whether `path` is the console's: /console or under /console/.
  static bool Handles(std::string_view path);
  // The page's paths, served without a token (ListenerOptions::public_paths).
  static const std::vector<std::string>& PublicPaths();

  // Answers a request for one of the console's paths.
  void Handle(http::Request request, http::Responder respond);
  // A handler that answers the console's paths itself (404 for all of them
  // when [console] enabled = false) and passes every other request to `next`.
  http::Handler Wrap(http::Handler next);

 private:
  http::Response Api(const http::Request& request, std::string_view what);
  // One per /console/api/ endpoint (what the page reads, what it does).
  http::Response Whoami(const http::Principal& who);
  http::Response UnknownRecords(const std::map<std::string, std::string>& query);
  http::Response OneRecord(const std::map<std::string, std::string>& query);
  http::Response Attempts(const http::Principal& who,
                          const std::map<std::string, std::string>& query);
  http::Response ReplayChart(const std::map<std::string, std::string>& query);
  // release, set-outcome, evict: fence-checked acts on one record.
  http::Response Act(const http::Request& request, std::string_view what);

  Ledger& ledger_;
  const Config& config_;
  WorkerPool pool_;  // last: its tasks use everything above
};

}  // namespace idem::console

// Calling an HTTP front's handler without sockets (the ledger API's, the
// console's): a request as the listener hands it over, and the one answer
// its Responder gets.
#pragma once

#include <future>
#include <memory>
#include <string>
#include <utility>

#include "net/http_listener.h"

namespace idem::testing {

// `method` `target` with `body` (sent as application/json when not empty)
// from `who`.
inline http::Request MakeRequest(const std::string& method, const std::string& target,
                                 const std::string& body = {}, http::Principal who = {}) {
  http::Request r;
  r.method = method;
  r.target = target;
  r.path = target.substr(0, target.find('?'));
  if (target.find('?') != std::string::npos) r.query = target.substr(target.find('?') + 1);
  r.body = body;
  if (!body.empty()) r.headers.push_back({"Content-Type", "application/json"});
  r.principal = std::move(who);
  return r;
}

// Hands `request` to `handle(request, responder)` and waits for its answer.
template <typename Handle>
http::Response CallHandler(Handle&& handle, http::Request request) {
  auto promise = std::make_shared<std::promise<http::Response>>();
  auto future = promise->get_future();
  handle(std::move(request), [promise](http::Response res) { promise->set_value(std::move(res)); });
  return future.get();
}

}  // namespace idem::testing

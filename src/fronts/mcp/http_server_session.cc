#include "fronts/mcp/http_server_session.h"

#include <algorithm>
#include <iostream>

#include "fronts/mcp/http_protocol.h"
#include "fronts/mcp/json_rpc.h"
#include "fronts/mcp/log_line.h"

namespace idem::mcp {
namespace {

// The JSON-RPC answer to a request whose session ended before the upstream
// answered it.
std::string SessionEndedAnswer(std::string_view id_json, std::string_view reason) {
  return JsonRpcError(
      id_json, kJsonRpcInternalError,
      "idemgate: the session ended before the upstream answered (" + std::string(reason) + ")");
}

}  // namespace

ServerSession::ServerSession(HttpSessionInfo info, size_t max_json_depth, size_t max_undelivered,
                             std::function<void(ServerSession*)> on_end)
    : info_(std::move(info)),
      max_json_depth_(max_json_depth),
      max_undelivered_(max_undelivered),
      on_end_(std::move(on_end)),
      last_activity_(std::chrono::steady_clock::now()) {}

ServerSession::~ServerSession() = default;

void ServerSession::Start(std::function<void(std::string message)> on_message,
                          std::function<void(std::string reason)> on_closed) {
  pump_.Start(std::move(on_message), std::move(on_closed));
}

bool ServerSession::RunOnSessionThread(std::function<void()> task) {
  return pump_.Post(std::move(task));
}

bool ServerSession::Send(std::string message) {
  Result<MessageInfo> info = InspectMessage(message, max_json_depth_);
  std::lock_guard lock(mu_);
  if (ended_) return false;
  Touch();
  if (!info) {
    LogLine("mcp http", "dropping a message for the client that is not a JSON-RPC object: " +
                            info.error().message);
    return true;
  }
  if (info->is_response()) {
    auto it = waiting_.find(info->id_key);
    if (it == waiting_.end()) {
      LogLine("mcp http", "dropping a response for id " + PrintableExcerpt(info->id_key, 80) +
                              ": no request with that id is waiting (the client went away?)");
      return true;
    }
    std::shared_ptr<Exchange> ex = it->second;
    std::string key = it->first;
    waiting_.erase(it);
    if (info_.stateless) {
      Result<std::string> restored = ReplaceId(message, ex->outstanding[key]);
      if (restored) message = std::move(*restored);
    }
    Answer(ex, key, std::move(message));
    return true;
  }
  // A request or notification from the upstream.
  std::shared_ptr<Exchange> target;
  if (!info->progress_token.empty()) {
    for (const auto& ex : posts_) {
      if (ex->kind == Exchange::Kind::kPostSse &&
          ex->progress_tokens.contains(info->progress_token)) {
        target = ex;
        break;
      }
    }
  }
  if (!target && info_.stateless) {
    // Sessionless clients share this session: a message that names no
    // client's request has no safe destination.
    LogLine("mcp http", "dropping a " + info->method +
                            " message: sessionless clients only receive answers and "
                            "progress for their own requests");
    return true;
  }
  if (!target) {
    size_t sse_posts = 0;
    for (const auto& ex : posts_) {
      if (ex->kind == Exchange::Kind::kPostSse) {
        ++sse_posts;
        target = ex;
      }
    }
    if (sse_posts != 1) target = get_;
  }
  if (target) {
    Emit(target, std::move(message));
  } else {
    if (undelivered_.size() >= max_undelivered_) {
      undelivered_.pop_front();
      LogLine("mcp http",
              "the client has no stream open: dropped the oldest buffered server message");
    }
    undelivered_.push_back(std::move(message));
  }
  return true;
}

void ServerSession::Close() {
  std::function<void(ServerSession*)> on_end;
  {
    std::lock_guard lock(mu_);
    if (ended_) return;
    on_end = std::move(on_end_);
    on_end_ = nullptr;
  }
  if (on_end) on_end(this);
  Shutdown("closed by the proxy");
}

ServerSession::Outcome ServerSession::BeginPost(const std::shared_ptr<Exchange>& ex,
                                                const MessageBatch& batch) {
  std::vector<std::string> to_deliver;
  std::lock_guard lock(mu_);
  if (ended_) return Outcome::kClosed;
  // Check every id before registering any, so a refused batch leaves nothing behind.
  if (!info_.stateless) {
    std::set<std::string> seen;
    for (const MessageInfo& m : batch.messages) {
      if (!m.is_request()) continue;
      if (waiting_.contains(m.id_key) || !seen.insert(m.id_key).second) {
        return Outcome::kDuplicateId;
      }
    }
  }
  std::vector<std::pair<std::string, std::string>> registered;  // key → client id JSON
  for (const MessageInfo& m : batch.messages) {
    if (!m.is_request()) {
      if (std::optional<std::string> message = ForUpstream(m)) {
        to_deliver.push_back(std::move(*message));
      }
      continue;
    }
    std::optional<std::string_view> raw_id = FindTopLevelMember(m.raw, "id");
    if (!raw_id) return Outcome::kBadMessage;
    if (info_.stateless) {
      std::string private_id = "\"idemgate-client-" + std::to_string(next_private_id_++) + "\"";
      Result<std::string> rewritten = ReplaceId(m.raw, private_id);
      if (!rewritten) return Outcome::kBadMessage;
      registered.emplace_back(private_id, std::string(*raw_id));
      to_deliver.push_back(std::move(*rewritten));
    } else {
      registered.emplace_back(m.id_key, std::string(*raw_id));
      to_deliver.push_back(m.raw);
    }
    if (!m.progress_token.empty()) ex->progress_tokens.insert(m.progress_token);
  }
  for (auto& [key, id_json] : registered) {
    ex->outstanding[key] = id_json;
    waiting_[key] = ex;
  }
  ex->batch = batch.is_batch;
  posts_.push_back(ex);
  Touch();
  for (std::string& message : to_deliver) pump_.Push(std::move(message));
  return Outcome::kOk;
}

bool ServerSession::Deliver(const MessageBatch& batch) {
  std::lock_guard lock(mu_);
  if (ended_) return false;
  Touch();
  for (const MessageInfo& m : batch.messages) {
    if (std::optional<std::string> message = ForUpstream(m)) pump_.Push(std::move(*message));
  }
  return true;
}

std::optional<std::string> ServerSession::ForUpstream(const MessageInfo& m) const {
  if (!info_.stateless || m.method != "notifications/cancelled") return m.raw;
  std::optional<std::string_view> params = FindTopLevelMember(m.raw, "params");
  std::optional<std::string_view> request_id =
      params ? FindTopLevelMember(*params, "requestId") : std::nullopt;
  if (!request_id) {  // none, or a member given twice that a reader could take either way
    LogLine("mcp http", "dropping a notifications/cancelled without one params.requestId");
    return std::nullopt;
  }
  // Sessionless clients share this session and only their own request ids
  // tell them apart, so a cancel reaches the one request that has its id.
  const std::string wanted = IdKeyOfText(*request_id);
  const std::string* private_id = nullptr;
  size_t matches = 0;
  for (const auto& [key, ex] : waiting_) {
    auto it = ex->outstanding.find(key);
    if (it == ex->outstanding.end() || IdKeyOfText(it->second) != wanted) continue;
    private_id = &it->first;
    ++matches;
  }
  if (matches != 1) {
    LogLine("mcp http",
            "dropping a notifications/cancelled for request id " +
                PrintableExcerpt(*request_id, 80) +
                (matches == 0 ? ": no request of a sessionless client with that id is waiting"
                              : ": several sessionless clients have a request with that id "
                                "waiting, so it names none of them"));
    return std::nullopt;
  }
  const size_t offset = static_cast<size_t>(request_id->data() - m.raw.data());
  std::string out = m.raw.substr(0, offset);
  out += *private_id;
  out += m.raw.substr(offset + request_id->size());
  return out;
}

ServerSession::AttachOutcome ServerSession::AttachGet(const std::shared_ptr<Exchange>& ex) {
  std::lock_guard lock(mu_);
  if (ended_) return AttachOutcome::kClosed;
  if (get_ && !get_->finished) return AttachOutcome::kConflict;
  get_ = ex;
  Touch();
  while (!undelivered_.empty()) {
    Emit(ex, std::move(undelivered_.front()));
    undelivered_.pop_front();
  }
  return AttachOutcome::kOk;
}

void ServerSession::Detach(const std::shared_ptr<Exchange>& ex) {
  std::lock_guard lock(mu_);
  ex->finished = true;
  std::erase(posts_, ex);
  if (get_ == ex) get_.reset();
  for (const auto& [key, id_json] : ex->outstanding) {
    auto it = waiting_.find(key);
    if (it != waiting_.end() && it->second == ex) waiting_.erase(it);
  }
  Touch();
}

void ServerSession::Shutdown(const std::string& reason) {
  {
    std::lock_guard lock(mu_);
    if (ended_) return;
    // Answer every waiting request so its POST completes.
    std::vector<std::shared_ptr<Exchange>> posts = posts_;
    for (const auto& ex : posts) {
      std::map<std::string, std::string> outstanding = ex->outstanding;
      for (const auto& [key, id_json] : outstanding) {
        Answer(ex, key, SessionEndedAnswer(id_json, reason));
      }
    }
    if (get_ && !get_->finished) {
      get_->finished = true;
      get_->sink->End();
    }
    get_.reset();
    posts_.clear();
    waiting_.clear();
    undelivered_.clear();
    ended_ = true;
    on_end_ = nullptr;
  }
  pump_.Close(reason);
}

bool ServerSession::ended() const {
  std::lock_guard lock(mu_);
  return ended_;
}

bool ServerSession::IdleFor(std::chrono::steady_clock::duration idle,
                            std::chrono::steady_clock::time_point now) const {
  std::lock_guard lock(mu_);
  return posts_.empty() && !get_ && now - last_activity_ >= idle;
}

void ServerSession::Answer(const std::shared_ptr<Exchange>& ex, const std::string& key,
                           std::string message) {
  ex->outstanding.erase(key);
  if (ex->finished) return;
  bool last = ex->outstanding.empty();
  if (ex->kind == Exchange::Kind::kPostJson) {
    ex->json_answers.push_back(std::move(message));
  } else if (last) {
    ex->finished = true;
    std::erase(posts_, ex);
    ex->sink->Final(std::move(message));
    return;
  } else {
    ex->sink->Event(std::move(message));
  }
  if (!last) return;
  ex->finished = true;
  std::erase(posts_, ex);
  if (ex->kind == Exchange::Kind::kPostJson) {
    std::string body;
    if (ex->batch) {
      body = "[";
      for (size_t i = 0; i < ex->json_answers.size(); ++i) {
        if (i > 0) body.push_back(',');
        body.append(ex->json_answers[i]);
      }
      body.push_back(']');
    } else {
      body = std::move(ex->json_answers.front());
    }
    ex->sink->Json(std::move(body));
  } else {
    ex->sink->End();
  }
}

void ServerSession::Emit(const std::shared_ptr<Exchange>& ex, std::string message) {
  if (ex->finished || ex->kind == Exchange::Kind::kPostJson) return;
  ex->sink->Event(std::move(message));
}

}  // namespace idem::mcp

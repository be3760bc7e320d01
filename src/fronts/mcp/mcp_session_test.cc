// The MCP session between two in-memory channels: a test-driven client and a
// scripted upstream that counts executions. Memory store, FakeClock, no
// sockets, no sleeps (threads meet on condition variables and the clock's
// waiter count).
#include "fronts/mcp/mcp_session.h"

#include <gtest/gtest.h>

#include <array>
#include <boost/json.hpp>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "fronts/mcp/host_turn.h"
#include "fronts/mcp/json_rpc.h"
#include "fronts/mcp/tool_gate.h"
#include "idem/caching_store.h"
#include "idem/canonical_json.h"
#include "idem/key.h"
#include "memory_store.h"
#include "store_wrapper.h"

namespace idem::mcp {
namespace {

namespace json = boost::json;
using namespace std::chrono_literals;

// A deadlock guard for waits in tests, not a timing device: a correct run
// never comes near it.
constexpr auto kTestTimeout = 20s;

// A Channel whose peer is the test. Inject() queues a message that the
// channel's own thread delivers in order; what the session sends is recorded
// and handed to an optional handler (the scripted peer).
class FakeChannel final : public Channel {
 public:
  ~FakeChannel() override {
    {
      std::lock_guard g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  void Start(std::function<void(std::string)> on_message,
             std::function<void(std::string)> on_closed) override {
    thread_ =
        std::thread([this, on_message = std::move(on_message), on_closed = std::move(on_closed)] {
          std::unique_lock g(mu_);
          while (true) {
            cv_.wait(g, [&] { return stop_ || !inbox_.empty(); });
            if (stop_) return;
            Item item = std::move(inbox_.front());
            inbox_.pop_front();
            busy_ = true;
            if (item.close && item.stops_reading) peer_closed_ = true;
            g.unlock();
            if (item.close) {
              on_closed(item.text);
            } else {
              on_message(std::move(item.text));
            }
            g.lock();
            busy_ = false;
            cv_.notify_all();
            if (item.close) return;
          }
        });
  }

  bool Send(std::string message) override {
    std::function<void(const std::string&)> handler;
    {
      std::lock_guard g(mu_);
      if (closed_ || peer_closed_) return false;
      sent_.push_back(message);
      sent_from_.push_back(std::this_thread::get_id());
      handler = handler_;
    }
    cv_.notify_all();
    if (handler) handler(message);
    return true;
  }

  void Close() override {
    std::optional<std::string> close_reason;
    {
      std::lock_guard g(mu_);
      if (closed_) return;
      closed_ = true;
      close_reason = close_answer_;
    }
    cv_.notify_all();
    if (close_reason) InjectClose(*close_reason);
  }

  void CloseNow() override {
    {
      std::lock_guard g(mu_);
      closed_now_ = true;
    }
    Close();
  }

  // ---- the test's side
  void Inject(std::string message) {
    {
      std::lock_guard g(mu_);
      inbox_.push_back(Item{std::move(message), false, false});
    }
    cv_.notify_all();
  }
  // The peer closes its sending side. `stops_reading`: it no longer reads
  // either (a process that exited); false for a client that only closed
  // stdin and still reads our answers.
  void InjectClose(std::string reason, bool stops_reading = true) {
    {
      std::lock_guard g(mu_);
      inbox_.push_back(Item{std::move(reason), true, stops_reading});
    }
    cv_.notify_all();
  }
  // When the session closes this channel, the peer closes too (a child
  // exits on EOF).
  void CloseAnswer(std::optional<std::string> reason) {
    std::lock_guard g(mu_);
    close_answer_ = std::move(reason);
  }
  void SetHandler(std::function<void(const std::string&)> handler) {
    std::lock_guard g(mu_);
    handler_ = std::move(handler);
  }
  // Whether the message sent `index`-th was sent from the thread that
  // delivers this channel's messages (the session's reaction inside
  // on_message) rather than from a worker.
  bool SentFromDeliveringThread(size_t index) {
    std::lock_guard g(mu_);
    return index < sent_from_.size() && sent_from_[index] == thread_.get_id();
  }
  // Waits for every injected message to have been handled.
  void AwaitDelivered() {
    std::unique_lock g(mu_);
    ASSERT_TRUE(cv_.wait_for(g, kTestTimeout, [&] { return inbox_.empty() && !busy_; }));
  }
  // The first message sent that satisfies `pred` (waiting for it).
  std::string Await(const std::function<bool(const json::value&)>& pred) {
    std::unique_lock g(mu_);
    std::string found;
    bool ok = cv_.wait_for(g, kTestTimeout, [&] {
      for (const std::string& m : sent_) {
        boost::system::error_code ec;
        json::value v = json::parse(m, ec);
        if (!ec && pred(v)) {
          found = m;
          return true;
        }
      }
      return false;
    });
    EXPECT_TRUE(ok) << "timed out waiting for a message";
    return found;
  }
  std::vector<std::string> sent() {
    std::lock_guard g(mu_);
    return sent_;
  }
  bool closed() {
    std::lock_guard g(mu_);
    return closed_;
  }
  // Waits until the session closed this channel.
  void AwaitClosed() {
    std::unique_lock g(mu_);
    ASSERT_TRUE(cv_.wait_for(g, kTestTimeout, [&] { return closed_; }));
  }
  // Closed with CloseNow (a child would have got SIGTERM), not Close alone.
  bool closed_now() {
    std::lock_guard g(mu_);
    return closed_now_;
  }

 private:
  struct Item {
    std::string text;
    bool close;
    bool stops_reading;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> inbox_;
  std::vector<std::string> sent_;
  std::vector<std::thread::id> sent_from_;  // parallel to sent_
  std::function<void(const std::string&)> handler_;
  std::optional<std::string> close_answer_;
  bool busy_ = false;
  bool stop_ = false;
  bool closed_ = false;
  bool closed_now_ = false;
  bool peer_closed_ = false;
  std::thread thread_;
};

std::function<bool(const json::value&)> HasId(const json::value& id) {
  return [id](const json::value& v) {
    const auto* o = v.if_object();
    return o && o->contains("id") && o->at("id") == id &&
           (o->contains("result") || o->contains("error"));
  };
}

std::function<bool(const json::value&)> IsCall(std::string_view method, const json::value& id) {
  return [method = std::string(method), id](const json::value& v) {
    const auto* o = v.if_object();
    return o && o->contains("method") && o->at("method") == method.c_str() && o->contains("id") &&
           o->at("id") == id;
  };
}

constexpr std::string_view kToolsList =
    R"({"tools":[)"
    R"({"name":"create_ticket","description":"Opens a ticket.","inputSchema":{"type":"object","properties":{"title":{"type":"string"}}}},)"
    R"( {"name":"search", "description":"Searches.","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}},)"
    R"({"name":"delete_all","description":"Deletes everything.","inputSchema":{"type":"object"},"annotations":{"destructiveHint":true}},)"
    R"({"name":"own_nonce","inputSchema":{"type":"object","properties":{"repeat_nonce":{"type":"integer"}}}},)"
    // MCP 2026-07-28: arguments a Streamable HTTP client mirrors into Mcp-Param-* headers.
    R"({"name":"charge","inputSchema":{"type":"object","properties":{)"
    R"("turn":{"type":"string","x-mcp-header":"TurnId"},"key":{"type":"string","x-mcp-header":"Key"},)"
    R"("order":{"type":"object","properties":{"region":{"type":"string","x-mcp-header":"Region"}}}}}})"
    R"(],"nextCursor":"page2"})";

// The upstream MCP server: answers tools/list and tools/call, counts
// executions per tool, holds "slow_tool" calls until the test answers them.
class ScriptedServer {
 public:
  explicit ScriptedServer(FakeChannel& channel) : channel_(channel) {
    channel_.SetHandler([this](const std::string& m) { Handle(m); });
  }

  int executions(const std::string& tool) {
    std::lock_guard g(mu_);
    return executions_[tool];
  }
  // Every tools/call the server received for `tool`, as parsed JSON.
  std::vector<json::value> calls(const std::string& tool) {
    std::lock_guard g(mu_);
    return calls_[tool];
  }
  // What find_ticket, the reconcile lookup, answers.
  enum class Lookup { kFound, kNotFound, kIsError, kNoVerdict };
  void set_lookup(Lookup lookup) {
    std::lock_guard g(mu_);
    lookup_ = lookup;
  }
  // The JSON-RPC error code insert_then_throw answers with.
  void set_error_code(int code) {
    std::lock_guard g(mu_);
    error_code_ = code;
  }
  void Answer(std::string_view id_text, std::string_view result) {
    channel_.Inject(R"({"jsonrpc":"2.0","id":)" + std::string(id_text) + R"(,"result":)" +
                    std::string(result) + "}");
  }

 private:
  void Handle(const std::string& text) {
    auto msg = ParseMessage(text);
    if (!msg || msg->kind != Message::Kind::kRequest) return;
    if (msg->method == "tools/list") {
      Answer(msg->id_text, kToolsList);
      return;
    }
    if (msg->method != "tools/call") return;
    const json::value request = json::parse(text);  // the test reads what the server got
    const std::string tool(request.at("params").at("name").as_string());
    int n;
    {
      std::lock_guard g(mu_);
      n = ++executions_[tool];
      calls_[tool].push_back(request);
    }
    if (tool == "create_ticket" || tool == "charge") {
      Answer(msg->id_text, R"({"content":[{"type":"text","text":"ticket #)" + std::to_string(n) +
                               R"("}],"structuredContent":{"id":)" + std::to_string(n) + "}}");
    } else if (tool == "search") {
      Answer(msg->id_text, R"({"content":[{"type":"text","text":"found it"}]})");
    } else if (tool == "fail_tool") {
      Answer(msg->id_text, R"({"content":[{"type":"text","text":"card declined #)" +
                               std::to_string(n) + R"("}],"isError":true})");
    } else if (tool == "bad_tool") {
      channel_.Inject(R"({"jsonrpc":"2.0","id":)" + msg->id_text +
                      R"(,"error":{"code":-32602,"message":"Unknown tool: bad_tool"}})");
    } else if (tool == "ask_tool") {
      Answer(
          msg->id_text,
          R"({"resultType":"input_required","inputRequests":{"confirm":{"method":"elicitation/create"}}})");
    } else if (tool == "find_ticket") {
      Answer(msg->id_text, LookupAnswer(lookup_));
    } else if (tool == "insert_then_throw") {
      // A low-level SDK server whose handler inserts and then throws.
      channel_.Inject(R"({"jsonrpc":"2.0","id":)" + msg->id_text + R"(,"error":{"code":)" +
                      std::to_string(error_code_) + R"(,"message":"Internal error"}})");
    }
    // slow_tool: held; the test answers it with Answer().
  }

  FakeChannel& channel_;
  std::mutex mu_;
  std::map<std::string, int> executions_;
  std::map<std::string, std::vector<json::value>> calls_;
  Lookup lookup_ = Lookup::kFound;
  int error_code_ = -32603;

  static std::string LookupAnswer(Lookup lookup) {
    switch (lookup) {
      case Lookup::kFound:
        return R"({"content":[{"type":"text","text":"ticket #7 exists"}],)"
               R"("structuredContent":{"found":true,"id":7}})";
      case Lookup::kNotFound:
        return R"({"content":[{"type":"text","text":"no such ticket"}],)"
               R"("structuredContent":{"found":false}})";
      case Lookup::kIsError:
        return R"({"content":[{"type":"text","text":"database timeout"}],"isError":true})";
      case Lookup::kNoVerdict:
        return R"({"content":[]})";
    }
    return "{}";
  }
};

class McpSessionTest : public ::testing::Test {
 protected:
  McpSessionTest() {
    upstream_.CloseAnswer("upstream exited with status 0");
    // No answer deadline unless a test sets one: the tests that count the
    // clock's waiters count a forwarded call as waiting without one.
    config_.mcp.call_timeout = Duration(0);
  }

  ~McpSessionTest() override { session_.reset(); }

  void StartSession(Store* store = nullptr, SessionOptions options = {}) {
    ledger_ = std::make_unique<Ledger>(store ? *store : *store_, clock_,
                                       LedgerOptions{"test", nullptr, true, on_attempt_});
    options.log = [this](std::string_view line) {
      std::lock_guard g(log_mu_);
      log_.emplace_back(line);
      log_cv_.notify_all();
    };
    options.verbose = true;
    session_ = std::make_unique<McpSession>(client_, upstream_, *ledger_, config_, options);
    session_->Start();
  }

  // Sends `request` from the client and returns the answer with its id.
  json::value Request(std::string request) {
    json::value id = json::parse(request).at("id");
    client_.Inject(std::move(request));
    std::string answer = client_.Await(HasId(id));
    return answer.empty() ? json::value() : json::parse(answer);
  }

  static std::string ToolCall(int id, std::string_view tool, std::string_view args,
                              std::string_view turn = "turn-1", std::string_view extra_meta = {}) {
    std::string meta = R"({"dev.idemgate/turnId":")" + std::string(turn) + "\"";
    meta.append(extra_meta);
    meta += "}";
    return R"({"jsonrpc":"2.0","id":)" + std::to_string(id) +
           R"(,"method":"tools/call","params":{"name":")" + std::string(tool) +
           R"(","arguments":)" + std::string(args) + R"(,"_meta":)" + meta + "}}";
  }

  void AwaitLog(std::string_view needle) {
    std::unique_lock g(log_mu_);
    bool ok = log_cv_.wait_for(g, kTestTimeout, [&] {
      for (const std::string& l : log_) {
        if (l.find(needle) != std::string::npos) return true;
      }
      return false;
    });
    EXPECT_TRUE(ok) << "no log line with: " << needle;
  }

  std::string KeyOf(std::string_view tool, std::string_view args, std::string_view turn) {
    auto fp = Fingerprint(args);
    EXPECT_TRUE(fp);
    auto key = DeriveKey(KeyInput{KeyMode::kTurn, std::string(turn), std::string(tool), *fp, {}});
    EXPECT_TRUE(key);
    return key->key;
  }

  static std::string Text(const json::value& response, size_t block) {
    const auto& content = response.at("result").at("content").as_array();
    if (block >= content.size()) return "";
    return std::string(content[block].at("text").as_string());
  }

  FakeClock clock_;
  std::unique_ptr<Store> store_ = NewMemoryStore(clock_);
  AttemptHook on_attempt_;  // set before StartSession
  std::unique_ptr<Ledger> ledger_;
  Config config_;
  FakeChannel client_;
  FakeChannel upstream_;
  ScriptedServer server_{upstream_};
  std::mutex log_mu_;
  std::condition_variable log_cv_;
  std::vector<std::string> log_;
  std::unique_ptr<McpSession> session_;  // last: destroyed first
};

TEST_F(McpSessionTest, PassesNonInterceptedMessagesThroughByteForByte) {
  StartSession();
  // Client → upstream: requests, notifications and a response to a server
  // request, with odd spacing and number spellings that a re-serialisation
  // would change.
  const std::vector<std::string> to_upstream = {
      R"({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}})",
      R"({ "jsonrpc" : "2.0" , "method" : "notifications/initialized" })",
      R"({"jsonrpc":"2.0","id":"r-1","method":"resources/read","params":{"uri":"file:///a","n":1.50,"big":123456789012345678901234}})",
      R"({"jsonrpc":"2.0","id":9,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}})",
      R"({"jsonrpc":"2.0","id":"srv-1","result":{"role":"assistant","content":{"type":"text","text":"hi"}}})",
      R"({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":0.5e0}})",
  };
  for (const std::string& m : to_upstream) client_.Inject(m);
  client_.AwaitDelivered();
  EXPECT_EQ(upstream_.sent(), to_upstream);

  // Upstream → client: responses, a server request (sampling), logging.
  const std::vector<std::string> to_client = {
      R"({"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{"listChanged":true}},"serverInfo":{"name":"s","version":"1"}}})",
      R"({"jsonrpc":"2.0","id":"r-1","result":{"contents":[{"uri":"file:///a","text":"x","n":1.50}]}})",
      R"({"jsonrpc":"2.0","id":"srv-1","method":"sampling/createMessage","params":{"messages":[],"maxTokens":10}})",
      R"({"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"\u00e9"}})",
      R"({"jsonrpc":"2.0","id":9,"result":{"resultType":"complete","supportedVersions":["2026-07-28"]}})",
  };
  for (const std::string& m : to_client) upstream_.Inject(m);
  upstream_.AwaitDelivered();
  EXPECT_EQ(client_.sent(), to_client);
}

TEST_F(McpSessionTest, InvalidJsonFromTheClientIsAnsweredWithParseError) {
  StartSession();
  client_.Inject(R"({"jsonrpc":"2.0","id":1,"method":"tools/call",)");
  std::string answer = client_.Await(
      [](const json::value& v) { return v.is_object() && v.as_object().contains("error"); });
  json::value v = json::parse(answer);
  EXPECT_EQ(v.at("error").at("code").as_int64(), -32700);
  EXPECT_TRUE(upstream_.sent().empty());
}

// Regression: a message that is JSON but not JSON-RPC 2.0 was forwarded, the
// upstream (the official SDK) dropped it without a word, and the client
// waited for ever.
TEST_F(McpSessionTest, MessagesThatAreNotJsonRpcAreAnsweredAndNotForwarded) {
  StartSession();
  struct Case {
    std::string message;
    json::value id;
    std::string says;
  };
  const Case cases[] = {
      {"42", nullptr, "must be a JSON object"},
      {"[]", nullptr, "an empty batch"},
      {R"({"foo":1})", nullptr, "neither a request"},
      {R"({"jsonrpc":"2.0","id":8,"method":42})", 8, "\"method\" must be a string"},
      {R"({"jsonrpc":"1.0","id":9,"method":"ping"})", 9, "\"jsonrpc\" must be \"2.0\""},
      {R"({"jsonrpc":"2.0","id":{"a":1},"method":"tools/call","params":{"name":"create_ticket"}})",
       nullptr, "\"id\" must be a string or a number, not an object"},
      {R"({"jsonrpc":"2.0","id":"p","method":"tools/call","params":"x"})", "p",
       "\"params\" must be an object"},
  };
  for (size_t i = 0; i < std::size(cases); ++i) {
    const Case& c = cases[i];
    client_.Inject(c.message);
    client_.AwaitDelivered();  // answered from inside the handler
    ASSERT_EQ(client_.sent().size(), i + 1) << c.message;
    json::value v = json::parse(client_.sent().back());
    EXPECT_EQ(v.at("id"), c.id) << c.message;
    EXPECT_EQ(v.at("error").at("code").as_int64(), kRpcInvalidRequest) << c.message;
    std::string message(v.at("error").at("message").as_string());
    EXPECT_NE(message.find(c.says), std::string::npos) << message;
    EXPECT_NE(message.find("nothing was forwarded"), std::string::npos) << message;
  }
  EXPECT_TRUE(upstream_.sent().empty());
}

TEST_F(McpSessionTest, UnparseableRequestsAreAnsweredWithTheirIdAndSayWhy) {
  StartSession();
  client_.Inject(
      "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"tools/call\",\"params\":{\"name\":"
      "\"create_ticket\",\"arguments\":{\"title\":\"a\xFF\"}}}");
  client_.AwaitDelivered();
  ASSERT_EQ(client_.sent().size(), 1u);
  json::value v = json::parse(client_.sent().back());
  EXPECT_EQ(v.at("id"), 5);
  EXPECT_EQ(v.at("error").at("code").as_int64(), kRpcParseError);
  std::string message(v.at("error").at("message").as_string());
  EXPECT_NE(message.find("at byte 102: invalid UTF-8"), std::string::npos) << message;

  std::string deep = R"({"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"x",)"
                     R"("arguments":{"a":)" +
                     std::string(10'000, '[') + std::string(10'000, ']') + "}}}";
  client_.Inject(deep);
  client_.AwaitDelivered();
  ASSERT_EQ(client_.sent().size(), 2u);
  v = json::parse(client_.sent().back());
  EXPECT_EQ(v.at("id"), 6);
  message = std::string(v.at("error").at("message").as_string());
  EXPECT_NE(message.find("nested deeper than"), std::string::npos) << message;
  EXPECT_NE(message.find("(limits.max_depth)"), std::string::npos) << message;
  EXPECT_TRUE(upstream_.sent().empty());
}

TEST_F(McpSessionTest, ToolsListIsRewrittenSoTheModelKnowsWhatIsSafeToRetry) {
  config_.tools.push_back(ToolRule{.match = "delete_all", .gated = false});
  StartSession();
  json::value r = Request(R"({"jsonrpc":"2.0","id":3,"method":"tools/list","params":{}})");
  const json::object& result = r.at("result").as_object();
  EXPECT_EQ(result.at("nextCursor"), "page2");
  const json::array& tools = result.at("tools").as_array();
  ASSERT_EQ(tools.size(), 5u);

  const json::value& create = tools[0];
  EXPECT_EQ(create.at("annotations").at("idempotentHint"), true);
  std::string description(create.at("description").as_string());
  EXPECT_TRUE(description.starts_with("Opens a ticket.\n\n[idemgate] Safe to retry:"));
  EXPECT_NE(description.find("(kept 24h)"), std::string::npos);
  EXPECT_NE(description.find("pass a new `repeat_nonce`"), std::string::npos);
  EXPECT_EQ(create.at("inputSchema").at("properties").at("repeat_nonce").at("type"), "string");
  EXPECT_EQ(create.at("inputSchema").at("properties").at("title").at("type"), "string");

  // Read-only: untouched.
  EXPECT_EQ(
      tools[1],
      json::parse(
          R"({"name":"search", "description":"Searches.","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}})"));

  // Mutating but ungated by config: marked not safe to retry.
  const json::value& del = tools[2];
  EXPECT_EQ(del.at("description"),
            "Deletes everything.\n\n[idemgate] Not safe to retry: this tool is not protected "
            "against duplicate calls.");
  EXPECT_FALSE(del.at("annotations").as_object().contains("idempotentHint"));

  // A tool with its own repeat_nonce argument keeps it, and no nonce is offered.
  const json::value& own = tools[3];
  EXPECT_EQ(own.at("inputSchema").at("properties").at("repeat_nonce").at("type"), "integer");
  EXPECT_EQ(own.at("annotations").at("idempotentHint"), true);
  EXPECT_EQ(std::string(own.at("description").as_string()).find("repeat_nonce"), std::string::npos);
}

// Once the upstream's tools are known, the operator is told what is gated,
// how each key is scoped, and which mutating tools are left ungated.
TEST_F(McpSessionTest, TheGatingOfEachListedToolIsAnnounced) {
  config_.tools.push_back(ToolRule{.match = "delete_all", .gated = false});
  config_.tools.push_back(
      ToolRule{.match = "own_nonce", .mode = KeyMode::kFields, .fields = {"/order"}});
  std::mutex mu;
  std::vector<std::string> lines;
  SessionOptions options;
  options.on_tools_listed = [&](const std::vector<std::string>& l) {
    std::lock_guard g(mu);
    lines = l;
  };
  StartSession(nullptr, options);
  Request(R"({"jsonrpc":"2.0","id":3,"method":"tools/list","params":{}})");
  std::lock_guard g(mu);
  EXPECT_EQ(lines, (std::vector<std::string>{
                       "ids: turn from meta:dev.idemgate/turnId, meta:vscode.requestId, "
                       "meta:x-codex-turn-metadata#/turn_id, hook:turn; session from "
                       "meta:vscode.conversationId, meta:x-codex-turn-metadata#/thread_id, "
                       "meta:threadId, meta:ai.opencode/sessionID, env:CLAUDE_CODE_SESSION_ID; "
                       "call id from meta:claudecode/toolUseId, meta:callId, "
                       "meta:agent-tool-call-request-id; a caller's key from "
                       "meta:dev.idemgate/idempotencyKey",
                       "gates charge: mode turn, scoped by the turn id (else the session id, kept "
                       "1h; else none), results kept 24h",
                       "gates create_ticket: mode turn, scoped by the turn id (else the session "
                       "id, kept 1h; else none), results kept 24h",
                       "NOT gated: delete_all is not read-only, but the config leaves it ungated "
                       "([[tool]] gated = false or mode = \"off\"): its retries run again",
                       "gates own_nonce: mode fields, keyed by /order alone, results kept 24h",
                       "passes 1 read-only tool(s) through: search",
                   }));
}

TEST_F(McpSessionTest, ReadOnlyToolCallsPassThroughUnchanged) {
  StartSession();
  Request(R"({"jsonrpc":"2.0","id":1,"method":"tools/list"})");
  const std::string call =
      R"({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"search","arguments":{"q":"x","repeat_nonce":"n"}}})";
  const std::string again =
      R"({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"search","arguments":{"q":"x","repeat_nonce":"n"}}})";
  Request(call);
  Request(again);
  EXPECT_EQ(server_.executions("search"), 2);
  EXPECT_EQ(upstream_.sent()[1], call);
  EXPECT_EQ(upstream_.sent()[2], again);
}

TEST_F(McpSessionTest, RetryInTheSameTurnIsReplayedNotExecuted) {
  StartSession();
  json::value first = Request(ToolCall(1, "create_ticket", R"({"title":"Printer on fire"})"));
  EXPECT_EQ(Text(first, 0), "ticket #1");
  json::value retry = Request(ToolCall(2, "create_ticket", R"({"title":"Printer on fire"})"));
  EXPECT_EQ(server_.executions("create_ticket"), 1);
  EXPECT_FALSE(client_.SentFromDeliveringThread(1)) << "the store is asked on a worker";
  EXPECT_EQ(Text(retry, 0), "ticket #1");
  EXPECT_EQ(retry.at("result").at("structuredContent").at("id"), 1);
  const auto& meta = retry.at("result").at("_meta");
  EXPECT_EQ(meta.at("dev.idemgate/replayed"), true);
  EXPECT_EQ(meta.at("dev.idemgate/key"),
            KeyOf("create_ticket", R"({"title":"Printer on fire"})", "turn-1").c_str());
  EXPECT_TRUE(std::string(meta.at("dev.idemgate/firstAt").as_string()).ends_with("Z"));
  EXPECT_NE(Text(retry, 1).find("the action was not performed again"), std::string::npos);
}

// A stored result without _meta gets the replay marks as a new object, built
// directly; it must be byte for byte the object that setting each mark into
// an empty _meta makes (the general path).
TEST(ReplayResultTest, MarksOfAResultWithoutMetaAreThoseSetIntoAnEmptyMeta) {
  Decision d;
  d.kind = Decision::Kind::kReplay;
  d.record.id = RecordId{"default", "k\"1"};
  d.record.state = RecordState::kCompleted;
  gate::Answer answer;
  answer.first_at = "2026-01-01T00:00:00.000Z";
  Config config;
  for (const bool drift : {false, true}) {
    d.drift = drift;
    d.record.outcome = Outcome{OutcomeClass::kSuccess, R"({"content":[],"isError":false})"};
    auto without = ReplayResult(d, answer, config);
    d.record.outcome =
        Outcome{OutcomeClass::kSuccess, R"({"content":[],"isError":false,"_meta":{}})"};
    auto with_empty = ReplayResult(d, answer, config);
    ASSERT_TRUE(without && with_empty);
    EXPECT_EQ(*without, *with_empty);
    EXPECT_NE(without->find(R"("_meta":{"dev.idemgate/replayed":true,"dev.idemgate/key":"k\"1",)"),
              std::string::npos)
        << *without;
  }
}

// A session whose ledger has a replay cache above the memory store, and
// the attempts it logs counted by outcome.
class CachedSessionTest : public McpSessionTest {
 protected:
  CachedSessionTest() {
    on_attempt_ = [this](const Call&, AttemptOutcome outcome, TimePoint, Duration) {
      std::lock_guard g(seen_mu_);
      ++seen_[outcome];
    };
  }
  ~CachedSessionTest() override {
    session_.reset();  // both use cache_, which goes first
    ledger_.reset();
  }
  void StartCached() { StartSession(&cache_); }
  int Seen(AttemptOutcome outcome) {
    std::lock_guard g(seen_mu_);
    return seen_[outcome];
  }

  CachingStore cache_{*store_, clock_, 1 << 20};
  std::mutex seen_mu_;
  std::map<AttemptOutcome, int> seen_;
};

// A retry of a finished call whose record the replay cache holds needs no
// I/O and no wait: the client channel's own thread answers it, where a
// worker would cost a wake-up per replay. Every execution, and a retry the
// store must be asked about (RetryInTheSameTurnIsReplayedNotExecuted: no
// cache), still runs on a worker.
TEST_F(CachedSessionTest, ARetryTheReplayCacheHoldsIsAnsweredOnTheClientsThread) {
  StartCached();
  json::value first = Request(ToolCall(1, "create_ticket", R"({"title":"Printer on fire"})"));
  EXPECT_EQ(Text(first, 0), "ticket #1");
  EXPECT_FALSE(client_.SentFromDeliveringThread(0)) << "an execution runs on a worker";
  json::value retry = Request(ToolCall(2, "create_ticket", R"({"title":"Printer on fire"})"));
  EXPECT_EQ(Text(retry, 0), "ticket #1");
  EXPECT_EQ(retry.at("result").at("_meta").at("dev.idemgate/replayed"), true);
  EXPECT_TRUE(client_.SentFromDeliveringThread(1));
  EXPECT_EQ(server_.executions("create_ticket"), 1);
  EXPECT_EQ(Seen(AttemptOutcome::kReplayed), 1);
}

// In observe mode the cache's answer is "would replay", and the call runs:
// on a worker, once, with the decision the cache gave (no second Begin).
TEST_F(CachedSessionTest, InObserveModeARetryTheCacheHoldsStillRunsOnAWorker) {
  config_.defaults.observe = true;
  StartCached();
  Request(ToolCall(1, "create_ticket", R"({"title":"a"})"));
  json::value retry = Request(ToolCall(2, "create_ticket", R"({"title":"a"})"));
  EXPECT_EQ(Text(retry, 0), "ticket #2") << "the retry ran, unmarked";
  EXPECT_FALSE(client_.SentFromDeliveringThread(1));
  EXPECT_EQ(server_.executions("create_ticket"), 2);
  EXPECT_EQ(Seen(AttemptOutcome::kWouldReplay), 1);
  EXPECT_EQ(Seen(AttemptOutcome::kExecuted), 2);  // both ran, as without the cache
}

TEST_F(McpSessionTest, FirstAnswerIsForwardedExactlyAsTheToolSentIt) {
  StartSession();
  client_.Inject(ToolCall(1, "create_ticket", R"({"title":"a"})"));
  std::string answer = client_.Await(HasId(1));
  EXPECT_EQ(
      answer,
      R"({"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"ticket #1"}],"structuredContent":{"id":1}}})");
}

TEST_F(McpSessionTest, KeyIsForwardedInMetaAndOtherBytesAreKept) {
  StartSession();
  Request(ToolCall(1, "create_ticket", R"({"title":"x","amount":123456789012345678901234})"));
  auto calls = server_.calls("create_ticket");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].at("params").at("_meta").at("dev.idemgate/idempotencyKey"),
            KeyOf("create_ticket", R"({"title":"x","amount":123456789012345678901234})", "turn-1")
                .c_str());
  EXPECT_EQ(calls[0].at("params").at("_meta").at("dev.idemgate/turnId"), "turn-1");
  // The big number reached the tool with all its digits.
  EXPECT_NE(upstream_.sent()[0].find(R"("amount":123456789012345678901234)"), std::string::npos);
}

TEST_F(McpSessionTest, ReorderedArgumentKeysStillReplay) {
  StartSession();
  Request(ToolCall(1, "create_ticket", R"({"title":"a","priority":2})"));
  json::value retry = Request(ToolCall(2, "create_ticket", R"({ "priority" : 2.0, "title":"a"})"));
  EXPECT_EQ(server_.executions("create_ticket"), 1);
  EXPECT_EQ(retry.at("result").at("_meta").at("dev.idemgate/replayed"), true);
}

TEST_F(McpSessionTest, NewTurnExecutesAgain) {
  StartSession();
  Request(ToolCall(1, "create_ticket", R"({"title":"a"})", "turn-1"));
  json::value second = Request(ToolCall(2, "create_ticket", R"({"title":"a"})", "turn-2"));
  EXPECT_EQ(server_.executions("create_ticket"), 2);
  EXPECT_EQ(Text(second, 0), "ticket #2");
}

TEST_F(McpSessionTest, NewRepeatNonceExecutesAgainAndIsNotForwarded) {
  StartSession();
  Request(ToolCall(1, "create_ticket", R"({"title":"a"})"));
  json::value again = Request(ToolCall(2, "create_ticket", R"({"title":"a","repeat_nonce":"n1"})"));
  EXPECT_EQ(Text(again, 0), "ticket #2");
  json::value replay =
      Request(ToolCall(3, "create_ticket", R"({"repeat_nonce":"n1","title":"a"})"));
  EXPECT_EQ(Text(replay, 0), "ticket #2");
  json::value third = Request(ToolCall(4, "create_ticket", R"({"title":"a","repeat_nonce":"n2"})"));
  EXPECT_EQ(Text(third, 0), "ticket #3");
  EXPECT_EQ(server_.executions("create_ticket"), 3);
  for (const json::value& call : server_.calls("create_ticket")) {
    EXPECT_EQ(call.at("params").at("arguments"), json::parse(R"({"title":"a"})"));
  }
}

TEST_F(McpSessionTest, ConcurrentDuplicateWaitsAndAttachesToTheRunningCall) {
  StartSession();
  client_.Inject(ToolCall(1, "slow_tool", "{}"));
  std::string forwarded = upstream_.Await(IsCall("tools/call", 1));
  client_.Inject(ToolCall(2, "slow_tool", "{}"));
  clock_.AwaitWaiters(2);  // the lease keeper and the duplicate, parked on the owner
  server_.Answer("1", R"({"content":[{"type":"text","text":"slow done"}]})");
  json::value first = json::parse(client_.Await(HasId(1)));
  json::value second = json::parse(client_.Await(HasId(2)));
  EXPECT_EQ(Text(first, 0), "slow done");
  EXPECT_EQ(Text(second, 0), "slow done");
  EXPECT_EQ(second.at("result").at("_meta").at("dev.idemgate/replayed"), true);
  EXPECT_EQ(server_.executions("slow_tool"), 1);
  ledger_->Flush();
  auto attempts = store_->QueryAttempts(AttemptFilter{});
  ASSERT_TRUE(attempts);
  bool attached = false;
  for (const Attempt& a : *attempts) attached |= a.outcome == AttemptOutcome::kAttached;
  EXPECT_TRUE(attached);
}

TEST_F(McpSessionTest, ToolErrorIsStoredAndReplayed) {
  StartSession();
  json::value first = Request(ToolCall(1, "fail_tool", R"({"card":"4242"})"));
  EXPECT_EQ(first.at("result").at("isError"), true);
  json::value retry = Request(ToolCall(2, "fail_tool", R"({"card":"4242"})"));
  EXPECT_EQ(server_.executions("fail_tool"), 1);
  EXPECT_EQ(retry.at("result").at("isError"), true);
  EXPECT_EQ(Text(retry, 0), "card declined #1");
  EXPECT_EQ(retry.at("result").at("_meta").at("dev.idemgate/replayed"), true);
}

TEST_F(McpSessionTest, ToolErrorIsReleasedWhenConfigured) {
  config_.tools.push_back(ToolRule{.match = "fail_tool"});
  config_.tools.back().overrides.errors = ErrorPolicy::kRelease;
  StartSession();
  Request(ToolCall(1, "fail_tool", "{}"));
  json::value retry = Request(ToolCall(2, "fail_tool", "{}"));
  EXPECT_EQ(server_.executions("fail_tool"), 2);
  EXPECT_EQ(Text(retry, 0), "card declined #2");
}

TEST_F(McpSessionTest, JsonRpcErrorIsForwardedAndReleased) {
  StartSession();
  client_.Inject(ToolCall(1, "bad_tool", "{}"));
  std::string answer = client_.Await(HasId(1));
  EXPECT_EQ(
      answer,
      R"({"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"Unknown tool: bad_tool"}})");
  Request(ToolCall(2, "bad_tool", "{}"));
  EXPECT_EQ(server_.executions("bad_tool"), 2);
  auto record = store_->Get(RecordId{"default", KeyOf("bad_tool", "{}", "turn-1")});
  ASSERT_TRUE(record);
  EXPECT_FALSE(record->has_value());
}

TEST_F(McpSessionTest, InputRequiredIsReleasedNotStored) {
  StartSession();
  json::value interim = Request(ToolCall(1, "ask_tool", R"({"amount":5})"));
  EXPECT_EQ(interim.at("result").at("resultType"), "input_required");
  auto record = store_->Get(RecordId{"default", KeyOf("ask_tool", R"({"amount":5})", "turn-1")});
  ASSERT_TRUE(record);
  EXPECT_FALSE(record->has_value());
  Request(ToolCall(2, "ask_tool", R"({"amount":5})"));  // the continuation is a new call
  EXPECT_EQ(server_.executions("ask_tool"), 2);
}

TEST_F(McpSessionTest, UpstreamDyingMidCallGivesOutcomeUnknown) {
  StartSession();
  client_.Inject(ToolCall(1, "slow_tool", R"({"x":1})"));
  upstream_.Await(IsCall("tools/call", 1));
  client_.Inject(R"({"jsonrpc":"2.0","id":2,"method":"resources/read","params":{"uri":"a"}})");
  upstream_.Await(IsCall("resources/read", 2));
  upstream_.InjectClose("upstream exited with status 1");

  json::value call = json::parse(client_.Await(HasId(1)));
  EXPECT_EQ(call.at("result").at("isError"), true);
  EXPECT_EQ(call.at("result").at("_meta").at("dev.idemgate/condition"), "outcome_unknown");
  std::string message = Text(call, 0);
  EXPECT_NE(message.find("may already have happened"), std::string::npos);
  EXPECT_NE(message.find("upstream exited with status 1"), std::string::npos);
  json::value read = json::parse(client_.Await(HasId(2)));
  EXPECT_EQ(read.at("error").at("code").as_int64(), kRpcUpstreamUnavailable);

  SessionEnd end = session_->Wait();
  EXPECT_TRUE(end.upstream_closed_first);
  EXPECT_EQ(end.upstream_reason, "upstream exited with status 1");
  EXPECT_TRUE(client_.closed());
  auto record = store_->Get(RecordId{"default", KeyOf("slow_tool", R"({"x":1})", "turn-1")});
  ASSERT_TRUE(record);
  ASSERT_TRUE(record->has_value());
  EXPECT_EQ((*record)->state, RecordState::kUnknown);
}

TEST_F(McpSessionTest, RetryOfAnUnknownOutcomeIsAConditionNotAnExecution) {
  StartSession();
  const std::string key = KeyOf("slow_tool", "{}", "turn-1");
  auto claim = store_->Claim(
      ClaimRequest{RecordId{"default", key}, *Fingerprint("{}"), "slow_tool", "turn-1"});
  ASSERT_TRUE(claim && claim->claimed);
  ASSERT_TRUE(store_->MarkUnknown(RecordId{"default", key}, claim->record.fence, 3600s));
  json::value r = Request(ToolCall(1, "slow_tool", "{}"));
  EXPECT_EQ(r.at("result").at("isError"), true);
  EXPECT_EQ(r.at("result").at("_meta").at("dev.idemgate/condition"), "outcome_unknown");
  EXPECT_NE(Text(r, 0).find("idemgate resolve " + key), std::string::npos);
  EXPECT_EQ(server_.executions("slow_tool"), 0);
}

TEST_F(McpSessionTest, ConditionsInTheStatelessDialectCarryResultType) {
  StartSession();
  const std::string key = KeyOf("slow_tool", "{}", "turn-1");
  auto claim = store_->Claim(
      ClaimRequest{RecordId{"default", key}, *Fingerprint("{}"), "slow_tool", "turn-1"});
  ASSERT_TRUE(claim && claim->claimed);
  ASSERT_TRUE(store_->MarkUnknown(RecordId{"default", key}, claim->record.fence, 3600s));
  json::value r = Request(ToolCall(1, "slow_tool", "{}", "turn-1",
                                   R"(,"io.modelcontextprotocol/protocolVersion":"2026-07-28")"));
  EXPECT_EQ(r.at("result").at("resultType"), "complete");
  EXPECT_EQ(r.at("result").at("_meta").at("dev.idemgate/condition"), "outcome_unknown");
  json::value legacy = Request(ToolCall(2, "slow_tool", "{}"));
  EXPECT_FALSE(legacy.at("result").as_object().contains("resultType"));
}

TEST_F(McpSessionTest, StillRunningAfterTheWaitIsAnInProgressCondition) {
  config_.defaults.wait = Duration(0);
  StartSession();
  client_.Inject(ToolCall(1, "slow_tool", "{}"));
  upstream_.Await(IsCall("tools/call", 1));
  json::value r = Request(ToolCall(2, "slow_tool", "{}"));
  EXPECT_EQ(r.at("result").at("isError"), true);
  EXPECT_EQ(r.at("result").at("_meta").at("dev.idemgate/condition"), "in_progress");
  EXPECT_GE(r.at("result").at("_meta").at("dev.idemgate/retryAfterSeconds").as_int64(), 1);
  server_.Answer("1", R"({"content":[]})");
  client_.Await(HasId(1));
  EXPECT_EQ(server_.executions("slow_tool"), 1);
}

TEST_F(McpSessionTest, DriftInExplicitModeIsACondition) {
  config_.tools.push_back(ToolRule{.match = "charge", .mode = KeyMode::kExplicit});
  StartSession();
  const std::string key_meta = R"(,"dev.idemgate/idempotencyKey":"order-42")";
  json::value first = Request(ToolCall(1, "charge", R"({"amount":10})", "t", key_meta));
  EXPECT_EQ(Text(first, 0), "ticket #1");
  json::value drift = Request(ToolCall(2, "charge", R"({"amount":11})", "t", key_meta));
  EXPECT_EQ(drift.at("result").at("isError"), true);
  EXPECT_EQ(drift.at("result").at("_meta").at("dev.idemgate/condition"), "drift");
  EXPECT_NE(Text(drift, 0).find("order-42"), std::string::npos);
  EXPECT_NE(Text(drift, 0).find("first used at"), std::string::npos);
  json::value missing = Request(ToolCall(3, "charge", R"({"amount":10})"));
  EXPECT_EQ(missing.at("result").at("_meta").at("dev.idemgate/condition"), "missing_key");
  EXPECT_EQ(server_.executions("charge"), 1);
}

TEST_F(McpSessionTest, KeyArgumentCarriesTheKeyToTheTool) {
  config_.tools.push_back(ToolRule{.match = "charge", .key_argument = "client_token"});
  StartSession();
  Request(ToolCall(1, "charge", R"({"amount":10})"));
  auto calls = server_.calls("charge");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].at("params").at("arguments").at("client_token"),
            KeyOf("charge", R"({"amount":10})", "turn-1").c_str());
}

TEST_F(McpSessionTest, ArgumentsThatAreNotIJsonAreRefused) {
  StartSession();
  json::value r = Request(ToolCall(1, "create_ticket", R"({"a":1,"a":2})"));
  EXPECT_EQ(r.at("error").at("code").as_int64(), kRpcInvalidParams);
  EXPECT_EQ(server_.executions("create_ticket"), 0);
}

TEST_F(McpSessionTest, StoreDownFailsClosedWithARetryableError) {
  testing::FailingStore failing(*store_, 1);
  StartSession(&failing);
  json::value r = Request(ToolCall(1, "create_ticket", R"({"title":"a"})"));
  EXPECT_EQ(r.at("error").at("code").as_int64(), kRpcStoreUnavailable);
  EXPECT_EQ(r.at("error").at("data").at("retryable"), true);
  EXPECT_TRUE(upstream_.sent().empty());
  EXPECT_EQ(server_.executions("create_ticket"), 0);
  session_.reset();  // before `failing`, which the ledger uses
  ledger_.reset();
}

// Guarantees review F9: a tool server that never answered kept its gated
// call waiting with no deadline: the client never got an answer, every retry
// got "in progress" while the lease was renewed, and the call held a budget
// slot. Past [mcp] call_timeout (the ledger's clock) the record is unknown,
// the client is told so, a retry is refused as unknown, and the late answer
// is still stored.
TEST_F(McpSessionTest, ACallUnansweredWithinCallTimeoutBecomesUnknownAndIsAnswered) {
  config_.mcp.call_timeout = Duration(60'000);
  StartSession();
  client_.Inject(ToolCall(1, "slow_tool", R"({"t":1})"));
  upstream_.Await(IsCall("tools/call", 1));
  clock_.AwaitWaiters(2);  // the lease keeper, and the call waiting for its answer
  clock_.Advance(Duration(60'000));
  json::value answer = json::parse(client_.Await(HasId(1)));
  EXPECT_EQ(answer.at("result").at("_meta").at("dev.idemgate/condition"), "outcome_unknown");
  EXPECT_NE(Text(answer, 0).find("call_timeout"), std::string::npos) << Text(answer, 0);
  AwaitLog("outcome unknown: no answer within call_timeout");
  const RecordId id{"default", KeyOf("slow_tool", R"({"t":1})", "turn-1")};
  auto record = store_->Get(id);
  ASSERT_TRUE(record && record->has_value());
  EXPECT_EQ((*record)->state, RecordState::kUnknown);

  json::value retry = Request(ToolCall(2, "slow_tool", R"({"t":1})"));
  EXPECT_EQ(retry.at("result").at("_meta").at("dev.idemgate/condition"), "outcome_unknown");
  EXPECT_EQ(server_.executions("slow_tool"), 1);

  server_.Answer("1", R"({"content":[{"type":"text","text":"done late"}]})");
  AwaitLog("a late answer, after the call was given up, settled the record");
  record = store_->Get(id);
  ASSERT_TRUE(record && record->has_value());
  EXPECT_EQ((*record)->state, RecordState::kCompleted);
}

TEST_F(McpSessionTest, CancelledCallBecomesUnknownAndALateAnswerSettlesIt) {
  SessionOptions options;
  options.cancel_grace = Duration(5'000);
  StartSession(nullptr, options);
  client_.Inject(ToolCall(1, "slow_tool", R"({"y":1})"));
  upstream_.Await(IsCall("tools/call", 1));
  const std::string cancel =
      R"({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1,"reason":"timeout"}})";
  client_.Inject(cancel);
  upstream_.Await([](const json::value& v) {
    return v.is_object() && v.as_object().contains("method") &&
           v.at("method") == "notifications/cancelled";
  });
  clock_.AwaitWaiters(2);  // the lease keeper and the call, waiting out the grace
  clock_.Advance(Duration(5'001));
  AwaitLog("outcome unknown: cancelled");
  const RecordId id{"default", KeyOf("slow_tool", R"({"y":1})", "turn-1")};
  auto record = store_->Get(id);
  ASSERT_TRUE(record && record->has_value());
  EXPECT_EQ((*record)->state, RecordState::kUnknown);

  server_.Answer("1", R"({"content":[{"type":"text","text":"done late"}]})");
  AwaitLog("a late answer, after the call was given up, settled the record");
  record = store_->Get(id);
  ASSERT_TRUE(record && record->has_value());
  EXPECT_EQ((*record)->state, RecordState::kCompleted);
  for (const std::string& m : client_.sent()) {
    EXPECT_EQ(m.find(R"("id":1)"), std::string::npos) << "a cancelled call was answered: " << m;
  }
}

TEST_F(McpSessionTest, ReconcileFindsTheOutcomeOfADeadOwner) {
  config_.tools.push_back(ToolRule{.match = "create_ticket", .reconcile = "find_ticket"});
  config_.tools.back().overrides.on_unknown = OnUnknown::kReconcile;
  StartSession();
  const std::string key = KeyOf("create_ticket", R"({"title":"a"})", "turn-1");
  auto claim = store_->Claim(ClaimRequest{
      RecordId{"default", key}, *Fingerprint(R"({"title":"a"})"), "create_ticket", "turn-1"});
  ASSERT_TRUE(claim && claim->claimed);
  clock_.Advance(Duration(31'000));  // the owner's lease runs out

  json::value r = Request(ToolCall(1, "create_ticket", R"({"title":"a"})"));
  EXPECT_EQ(Text(r, 0), "ticket #7 exists");
  EXPECT_EQ(r.at("result").at("_meta").at("dev.idemgate/reconciled"), true);
  EXPECT_EQ(server_.executions("create_ticket"), 0);
  auto lookups = server_.calls("find_ticket");
  ASSERT_EQ(lookups.size(), 1u);
  EXPECT_EQ(lookups[0].at("id"), "idemgate-reconcile-1");
  EXPECT_EQ(lookups[0].at("params").at("arguments"), json::parse(R"({"title":"a"})"));
  for (const std::string& m : client_.sent()) {
    EXPECT_EQ(m.find("idemgate-reconcile-1"), std::string::npos) << "a proxy answer reached the client";
  }
}

TEST_F(McpSessionTest, ReconcileThatFindsNothingExecutes) {
  config_.tools.push_back(ToolRule{.match = "create_ticket", .reconcile = "find_ticket"});
  config_.tools.back().overrides.on_unknown = OnUnknown::kReconcile;
  server_.set_lookup(ScriptedServer::Lookup::kNotFound);
  StartSession();
  const std::string key = KeyOf("create_ticket", R"({"title":"a"})", "turn-1");
  ASSERT_TRUE(store_->Claim(ClaimRequest{RecordId{"default", key}, *Fingerprint(R"({"title":"a"})"),
                                         "create_ticket", "turn-1"}));
  clock_.Advance(Duration(31'000));
  json::value r = Request(ToolCall(1, "create_ticket", R"({"title":"a"})"));
  EXPECT_EQ(Text(r, 0), "ticket #1");
  EXPECT_EQ(server_.executions("create_ticket"), 1);
}

// Found by a real SDK server: the owner died mid-charge, the lookup answered
// isError (a database timeout: it cannot tell), and that counted as "it did
// not happen": the retry charged again. A lookup that cannot tell, or
// answers without the contract's structuredContent.found, leaves the record
// unknown.
TEST_F(McpSessionTest, ReconcileThatCannotTellLeavesTheRecordUnknown) {
  config_.tools.push_back(ToolRule{.match = "create_ticket", .reconcile = "find_ticket"});
  config_.tools.back().overrides.on_unknown = OnUnknown::kReconcile;
  StartSession();
  int turn = 0;
  for (auto lookup : {ScriptedServer::Lookup::kIsError, ScriptedServer::Lookup::kNoVerdict}) {
    server_.set_lookup(lookup);
    const std::string t = "turn-c" + std::to_string(++turn);
    const std::string key = KeyOf("create_ticket", R"({"title":"a"})", t);
    ASSERT_TRUE(store_->Claim(ClaimRequest{RecordId{"default", key},
                                           *Fingerprint(R"({"title":"a"})"), "create_ticket", t}));
    clock_.Advance(Duration(31'000));
    json::value r = Request(ToolCall(turn, "create_ticket", R"({"title":"a"})", t));
    EXPECT_EQ(r.at("result").at("_meta").at("dev.idemgate/condition"), "outcome_unknown") << turn;
    auto record = store_->Get(RecordId{"default", key});
    ASSERT_TRUE(record && record->has_value());
    EXPECT_EQ((*record)->state, RecordState::kUnknown) << turn;
  }
  EXPECT_EQ(server_.executions("create_ticket"), 0);
  EXPECT_EQ(server_.executions("find_ticket"), 2);
}

// Found by a real SDK server: its handler inserted and then threw, the SDK
// answered -32603, and idemgate read every JSON-RPC error as "the tool did
// not run": the retry inserted again. The first caller gets the server's
// error as it was; the record is unknown; the retry is not executed.
TEST_F(McpSessionTest, JsonRpcErrorAfterTheToolRanLeavesTheOutcomeUnknown) {
  StartSession();
  int id = 0;
  // kRpcAnswerTooLarge: the child channel's answer in place of one over
  // max_message_bytes (guarantees review F9).
  for (int code : {-32603, -32000, -32099, int{kRpcAnswerTooLarge}, 1}) {
    server_.set_error_code(code);
    const std::string args = R"({"code":)" + std::to_string(code) + "}";
    client_.Inject(ToolCall(++id, "insert_then_throw", args));
    const std::string first = client_.Await(HasId(id));
    EXPECT_EQ(first, R"({"jsonrpc":"2.0","id":)" + std::to_string(id) + R"(,"error":{"code":)" +
                         std::to_string(code) + R"(,"message":"Internal error"}})");
    json::value retry = Request(ToolCall(++id, "insert_then_throw", args));
    EXPECT_EQ(retry.at("result").at("_meta").at("dev.idemgate/condition"), "outcome_unknown")
        << code;
    auto record = store_->Get(RecordId{"default", KeyOf("insert_then_throw", args, "turn-1")});
    ASSERT_TRUE(record && record->has_value()) << code;
    EXPECT_EQ((*record)->state, RecordState::kUnknown) << code;
  }
  EXPECT_EQ(server_.executions("insert_then_throw"), 5) << "each retry ran again";
}

// Found with the SDK client: refund_order then cancel_order, both with the
// explicit key "run-7": the cancel got the refund's result, marked
// replayed, and nothing was cancelled. A key met with another tool is
// refused as drift, whatever on_drift says.
TEST_F(McpSessionTest, OneExplicitKeySentWithTwoToolsIsRefusedForTheSecond) {
  config_.tools.push_back(ToolRule{.match = "charge"});
  config_.tools.back().overrides.on_drift = OnDrift::kReplay;
  StartSession();
  // (first tool, second tool, key): the second runs under on_drift =
  // replay (charge) and reject (create_ticket, the default).
  const std::vector<std::array<std::string, 3>> pairs = {{"create_ticket", "charge", "run-7"},
                                                         {"charge", "create_ticket", "run-8"}};
  int id = 0;
  for (const auto& [first_tool, second_tool, key] : pairs) {
    const std::string meta = R"(,"dev.idemgate/idempotencyKey":")" + key + "\"";
    json::value first = Request(ToolCall(++id, first_tool, R"({"order":42})", "t", meta));
    EXPECT_FALSE(first.at("result").as_object().contains("isError")) << key;
    json::value second = Request(ToolCall(++id, second_tool, R"({"order":42})", "t", meta));
    EXPECT_EQ(second.at("result").at("_meta").at("dev.idemgate/condition"), "drift") << key;
    EXPECT_NE(Text(second, 0).find("another tool, " + first_tool), std::string::npos)
        << Text(second, 0);
  }
  EXPECT_EQ(server_.executions("charge"), 1);
  EXPECT_EQ(server_.executions("create_ticket"), 1);
}

// Found by reading: a gated tools/call could take over the id of a plain
// request in flight; the plain request's answer was then taken for the
// tool's and stored as its outcome. Any id in flight is refused.
TEST_F(McpSessionTest, AGatedCallCannotTakeTheIdOfAPlainRequestInFlight) {
  StartSession();
  client_.Inject(R"({"jsonrpc":"2.0","id":5,"method":"resources/read","params":{"uri":"a"}})");
  upstream_.Await(IsCall("resources/read", 5));
  json::value refused = Request(ToolCall(5, "create_ticket", R"({"title":"a"})"));
  EXPECT_EQ(refused.at("error").at("code").as_int64(), kRpcInvalidRequest);
  EXPECT_NE(std::string(refused.at("error").at("message").as_string()).find("already in use"),
            std::string::npos);
  EXPECT_EQ(server_.executions("create_ticket"), 0);
  server_.Answer("5", R"({"contents":[]})");
  json::value read = json::parse(client_.Await([](const json::value& v) {
    return v.as_object().contains("result") && v.at("id") == 5;
  }));
  EXPECT_EQ(read.at("result").at("contents").as_array().size(), 0u);
  auto record = store_->Get(RecordId{"default", KeyOf("create_ticket", R"({"title":"a"})", "turn-1")});
  ASSERT_TRUE(record);
  EXPECT_FALSE(record->has_value());
}

// Review F7: cancelling a plain request freed its id at once, though the
// upstream may still answer it. A gated call that reused the id was then
// forwarded, and the late answer to the old request could be stored as its
// outcome. The id stays taken until the upstream answers; that answer is
// dropped (the client cancelled it), and the id is free again after it.
TEST_F(McpSessionTest, ACancelledPlainRequestKeepsItsIdUntilTheUpstreamAnswers) {
  StartSession();
  client_.Inject(R"({"jsonrpc":"2.0","id":5,"method":"resources/read","params":{"uri":"a"}})");
  upstream_.Await(IsCall("resources/read", 5));
  client_.Inject(
      R"({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5}})");
  json::value refused = Request(ToolCall(5, "create_ticket", R"({"title":"a"})"));
  ASSERT_TRUE(refused.as_object().contains("error")) << refused;
  EXPECT_EQ(refused.at("error").at("code").as_int64(), kRpcInvalidRequest);
  EXPECT_NE(std::string(refused.at("error").at("message").as_string()).find("cancelled request"),
            std::string::npos);
  EXPECT_EQ(server_.executions("create_ticket"), 0);

  server_.Answer("5", R"({"contents":["late"]})");
  upstream_.AwaitDelivered();
  for (const std::string& m : client_.sent()) {
    EXPECT_EQ(m.find("late"), std::string::npos) << "a cancelled request was answered: " << m;
  }
  client_.Inject(ToolCall(5, "create_ticket", R"({"title":"a"})"));
  json::value ran = json::parse(client_.Await([](const json::value& v) {
    return v.as_object().contains("result") && v.at("id") == 5;
  }));
  EXPECT_EQ(Text(ran, 0), "ticket #1");
  EXPECT_EQ(server_.executions("create_ticket"), 1);
}

// Found by reading: reconcile lookups and the stateless HTTP front's
// rewritten client ids shared the "idemgate-N" namespace from two counters,
// so a client's answer could be read as a lookup's. A lookup's id is never
// one a client request in flight holds.
TEST_F(McpSessionTest, AReconcileLookupNeverTakesAnIdInFlight) {
  config_.tools.push_back(ToolRule{.match = "create_ticket", .reconcile = "find_ticket"});
  config_.tools.back().overrides.on_unknown = OnUnknown::kReconcile;
  StartSession();
  client_.Inject(
      R"({"jsonrpc":"2.0","id":"idemgate-reconcile-1","method":"resources/read","params":{}})");
  upstream_.Await(IsCall("resources/read", "idemgate-reconcile-1"));
  const std::string key = KeyOf("create_ticket", R"({"title":"a"})", "turn-1");
  ASSERT_TRUE(store_->Claim(ClaimRequest{RecordId{"default", key}, *Fingerprint(R"({"title":"a"})"),
                                         "create_ticket", "turn-1"}));
  clock_.Advance(Duration(31'000));
  json::value r = Request(ToolCall(1, "create_ticket", R"({"title":"a"})"));
  EXPECT_EQ(r.at("result").at("_meta").at("dev.idemgate/reconciled"), true);
  auto lookups = server_.calls("find_ticket");
  ASSERT_EQ(lookups.size(), 1u);
  EXPECT_EQ(lookups[0].at("id"), "idemgate-reconcile-2");
}

// The turn comes from the first [mcp] turn_id source present (docs/hosts.md):
// a pointer into a _meta member that holds JSON text or an object; a member
// of an unexpected shape is skipped, not refused; the environment.
TEST_F(McpSessionTest, TheTurnIsReadFromTheFirstSourcePresent) {
  SessionOptions options;
  options.env = {{"CLAUDE_CODE_SESSION_ID", "s-env"}};
  StartSession(nullptr, options);
  auto call = [](int id, std::string_view meta) {
    return R"({"jsonrpc":"2.0","id":)" + std::to_string(id) +
           R"(,"method":"tools/call","params":{"name":"charge","arguments":{"a":1},"_meta":)" +
           std::string(meta) + "}}";
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"x-codex-turn-metadata":{"turn_id":"t-obj","thread_id":"th"}})", "t-obj"},
      {R"({"x-codex-turn-metadata":"{\"turn_id\":\"t-text\"}"})", "t-text"},
      {R"({"vscode.requestId":7})", "7"},
      {R"({"vscode.requestId":{"no":1},"x-codex-turn-metadata":{"turn_id":"t-2"}})", "t-2"},
      {R"({"vscode.conversationId":"c-1"})", "c-1"},  // a session: no turn id came
      {R"({"progressToken":"p"})", "s-env"},          // the environment's session
  };
  int id = 0;
  for (const auto& [meta, turn] : cases) {
    json::value r = Request(call(++id, meta));
    EXPECT_FALSE(r.at("result").as_object().contains("isError")) << meta;
    auto record = store_->Get(RecordId{"default", KeyOf("charge", R"({"a":1})", turn)});
    ASSERT_TRUE(record) << meta;
    EXPECT_TRUE(record->has_value()) << meta << " was not keyed by turn " << turn;
  }
  EXPECT_EQ(server_.executions("charge"), 6);
}

// hook:turn (docs/hosts.md, "Prompt hook"): the turn the prompt hook wrote
// last, read for each call; after the host's own turn id, before the
// session; no file, or a malformed one, falls back to the session, and the
// attempt log says which source scoped each call.
TEST_F(McpSessionTest, TheHookTurnIsReadPerCallAfterTheHostsOwnTurn) {
  const std::string dir = ::testing::TempDir() + "idem-hook-turn-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  SessionOptions options;
  options.env = {{"CLAUDE_CODE_SESSION_ID", "s-env"}};
  options.hook_turn_file = TurnFilePath(dir, "1-1");
  StartSession(nullptr, options);
  auto call = [](int id, std::string_view meta) {
    return R"({"jsonrpc":"2.0","id":)" + std::to_string(id) +
           R"(,"method":"tools/call","params":{"name":"charge","arguments":{"a":1},"_meta":)" +
           std::string(meta) + "}}";
  };
  auto prompt = [&](const std::string& turn) {
    ASSERT_TRUE(WriteTurnFile(dir, "1-1", HookTurn{"claude-code", "s", turn, 1}));
  };
  auto keyed_by = [&](int id, std::string_view meta, const std::string& turn) {
    Request(call(id, meta));
    auto record = store_->Get(RecordId{"default", KeyOf("charge", R"({"a":1})", turn)});
    ASSERT_TRUE(record);
    EXPECT_TRUE(record->has_value()) << "call " << id << " was not keyed by " << turn;
  };
  prompt("s/p1");
  keyed_by(1, R"({"claudecode/toolUseId":"toolu_1"})", "s/p1");
  keyed_by(2, R"({"vscode.requestId":"v-1"})", "v-1");  // a host's own turn id wins
  prompt("s/p2");
  keyed_by(3, R"({"claudecode/toolUseId":"toolu_2"})", "s/p2");
  std::filesystem::remove(options.hook_turn_file);
  keyed_by(4, R"({"progressToken":4})", "s-env");
  EXPECT_EQ(server_.executions("charge"), 4);

  ledger_->Flush();
  auto attempts = store_->QueryAttempts(AttemptFilter{.tool = "charge"});
  ASSERT_TRUE(attempts);
  std::set<std::string> details;
  for (const auto& a : *attempts) details.insert(a.detail);
  EXPECT_EQ(details, (std::set<std::string>{
                         "session: env:CLAUDE_CODE_SESSION_ID (no turn id)",
                         "turn: hook:turn (claude-code prompt hook); call id: "
                         "meta:claudecode/toolUseId",
                         "turn: meta:vscode.requestId",
                     }));
  std::filesystem::remove_all(dir);
}

// Observe mode (observe = true): every call runs; the attempt log says what
// enforcing would have answered, and the first call's record is kept.
TEST_F(McpSessionTest, ObserveModeRunsEveryCallAndLogsWhatEnforcingWouldHaveDone) {
  config_.defaults.observe = true;
  StartSession();
  json::value first = Request(ToolCall(1, "create_ticket", R"({"title":"a"})"));
  json::value retry = Request(ToolCall(2, "create_ticket", R"({"title":"a"})"));
  EXPECT_EQ(Text(first, 0), "ticket #1");
  EXPECT_EQ(Text(retry, 0), "ticket #2") << "the retry ran, unmarked";
  EXPECT_FALSE(retry.at("result").as_object().contains("_meta"));
  const std::string meta = R"(,"dev.idemgate/idempotencyKey":"k-obs")";
  Request(ToolCall(3, "create_ticket", R"({"title":"b"})", "t", meta));
  json::value drift = Request(ToolCall(4, "create_ticket", R"({"title":"c"})", "t", meta));
  EXPECT_EQ(Text(drift, 0), "ticket #4");
  EXPECT_EQ(server_.executions("create_ticket"), 4);
  ledger_->Flush();
  std::map<AttemptOutcome, int> seen;
  auto attempts = store_->QueryAttempts(AttemptFilter{});
  ASSERT_TRUE(attempts);
  for (const Attempt& a : *attempts) ++seen[a.outcome];
  EXPECT_EQ(seen[AttemptOutcome::kWouldReplay], 1);
  EXPECT_EQ(seen[AttemptOutcome::kWouldDrift], 1);
  EXPECT_EQ(seen[AttemptOutcome::kExecuted], 4);
  auto record = store_->Get(RecordId{"default", KeyOf("create_ticket", R"({"title":"a"})", "turn-1")});
  ASSERT_TRUE(record && record->has_value());
  EXPECT_NE((*record)->outcome->body.find("ticket #1"), std::string::npos)
      << "the record keeps the first call's outcome";
}

// Keys from headers (MCP 2026-07-28, SEP-2243): over Streamable HTTP the
// turn id and the key may come from the Mcp-Param-* headers that mirror the
// arguments a tool marks x-mcp-header; a header that disagrees with the body
// is refused with -32020 and nothing runs.
class HeaderSourcesTest : public McpSessionTest {
 protected:
  void SetUp() override {
    config_.mcp.turn_id = {*ParseIdSource("header:Mcp-Param-TurnId")};
    config_.mcp.key = {*ParseIdSource("header:mcp-param-key")};
    StartSession();
    Request(R"({"jsonrpc":"2.0","id":"list","method":"tools/list","params":{}})");
  }
  // A tools/call of charge as the HTTP front hands it on: with the headers.
  static std::string Charge(int id, std::string_view args, std::string_view headers,
                            std::string_view meta = "{}") {
    return R"({"jsonrpc":"2.0","id":)" + std::to_string(id) +
           R"(,"method":"tools/call","params":{"name":"charge","arguments":)" + std::string(args) +
           R"(,"_meta":)" + std::string(meta) + R"(},"dev.idemgate/requestHeaders":)" +
           std::string(headers) + "}";
  }
  static int ErrorCode(const json::value& r) {
    const auto* e = r.as_object().if_contains("error");
    return e ? static_cast<int>(e->at("code").as_int64()) : 0;
  }
};

TEST_F(HeaderSourcesTest, TheTurnIdComesFromItsMirrorHeaderAndIsNotForwarded) {
  const std::string args = R"({"turn":"t-9","order":{"region":"eu"}})";
  json::value r = Request(
      Charge(1, args, R"({"Mcp-Param-TurnId":"t-9","mcp-param-region":"=?base64?ZXU=?="})"));
  ASSERT_EQ(ErrorCode(r), 0) << json::serialize(r);
  auto record = store_->Get(RecordId{"default", KeyOf("charge", args, "t-9")});
  ASSERT_TRUE(record && record->has_value()) << "keyed by the turn of Mcp-Param-TurnId";
  Request(Charge(2, args, R"({"mcp-param-turnid":"t-9","mcp-param-region":"eu"})"));
  EXPECT_EQ(server_.executions("charge"), 1) << "the retry in turn t-9 replays";
  for (const json::value& call : server_.calls("charge")) {
    EXPECT_FALSE(call.as_object().contains("dev.idemgate/requestHeaders"));
  }
}

TEST_F(HeaderSourcesTest, TheKeyComesFromItsMirrorHeader) {
  json::value r = Request(Charge(1, R"({"key":"k-77"})", R"({"mcp-param-key":"k-77"})"));
  ASSERT_EQ(ErrorCode(r), 0) << json::serialize(r);
  auto record = store_->Get(RecordId{"default", "k-77"});
  ASSERT_TRUE(record && record->has_value()) << "the caller's key, from Mcp-Param-Key";
}

TEST_F(HeaderSourcesTest, AHeaderThatDisagreesWithTheBodyIsRefused) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"mcp-param-turnid":"t-1","mcp-param-region":"us"})",
       R"(Header mismatch: Mcp-Param-Region header value "us" does not match body value "eu" of arguments.order.region)"},
      {R"({"mcp-param-turnid":"t-1","mcp-param-region":"eu","mcp-param-key":"k"})",
       "Mcp-Param-Key was sent, but arguments.key is not in the body"},
      {R"({"mcp-param-turnid":"=?base64?!!?=","mcp-param-region":"eu"})",
       "Mcp-Param-TurnId cannot be decoded"},
  };
  int id = 0;
  for (const auto& [headers, why] : cases) {
    json::value r = Request(Charge(++id, R"({"turn":"t-1","order":{"region":"eu"}})", headers));
    ASSERT_EQ(ErrorCode(r), kMcpHeaderMismatch) << headers;
    const std::string message(r.at("error").at("message").as_string());
    EXPECT_NE(message.find(why), std::string::npos) << message;
  }
  // 2026-07-28: a client must mirror every marked argument it sends.
  json::value missing =
      Request(Charge(9, R"({"turn":"t-1"})", "{}",
                     R"({"io.modelcontextprotocol/protocolVersion":"2026-07-28"})"));
  EXPECT_EQ(ErrorCode(missing), kMcpHeaderMismatch) << json::serialize(missing);
  EXPECT_EQ(server_.executions("charge"), 0);
}

// The metrics' host label comes from the client's clientInfo: the session's
// initialize, or a 2026-07-28 request's own _meta.
TEST_F(McpSessionTest, CallsCarryTheHostTheClientNamed) {
  std::mutex mu;
  std::vector<std::string> hosts;
  on_attempt_ = [&](const Call& call, AttemptOutcome, TimePoint, Duration) {
    std::lock_guard g(mu);
    hosts.push_back(call.host);
  };
  StartSession();
  Request(ToolCall(1, "create_ticket", R"({"title":"a"})"));
  client_.Inject(
      R"({"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"claude-code","version":"2"}}})");
  Request(ToolCall(2, "create_ticket", R"({"title":"b"})"));
  Request(ToolCall(3, "create_ticket", R"({"title":"c"})", "turn-1",
                   R"(,"io.modelcontextprotocol/clientInfo":{"name":"Visual Studio Code"})"));
  std::lock_guard g(mu);
  EXPECT_EQ(hosts, (std::vector<std::string>{"", "claude-code", "Visual Studio Code"}));
}

// A re-planned retry (crewAI#5802): the same turn calls the tool again with
// other arguments, so the key differs and it runs; its attempt says so.
TEST_F(McpSessionTest, AReplannedCallInTheSameTurnRunsAndIsLoggedExecutedAgain) {
  StartSession();
  Request(ToolCall(1, "create_ticket", R"({"title":"a"})"));
  json::value replanned = Request(ToolCall(2, "create_ticket", R"({"title":"a!"})"));
  EXPECT_EQ(Text(replanned, 0), "ticket #2") << "a re-planned call still runs";
  Request(ToolCall(3, "create_ticket", R"({"title":"b"})", "turn-2"));  // another turn
  Request(ToolCall(4, "create_ticket", R"({"title":"c","repeat_nonce":"n1"})", "turn-2"));
  clock_.Advance(config_.mcp.replan_window + Duration(1));
  Request(ToolCall(5, "create_ticket", R"({"title":"d"})", "turn-2"));  // past the window
  EXPECT_EQ(server_.executions("create_ticket"), 5);
  ledger_->Flush();
  auto again = store_->QueryAttempts(AttemptFilter{.outcome = AttemptOutcome::kExecutedAgain});
  ASSERT_TRUE(again);
  ASSERT_EQ(again->size(), 1u) << "a new turn, a repeat_nonce and a late call are no re-plans";
  EXPECT_EQ(again->front().key, KeyOf("create_ticket", R"({"title":"a!"})", "turn-1"));
  EXPECT_NE(again->front().detail.find("re-planned: earlier key " +
                                       KeyOf("create_ticket", R"({"title":"a"})", "turn-1")),
            std::string::npos)
      << again->front().detail;
}

TEST_F(McpSessionTest, ReplanWindowZeroSwitchesTheSignalOff) {
  config_.mcp.replan_window = Duration(0);
  StartSession();
  Request(ToolCall(1, "create_ticket", R"({"title":"a"})"));
  Request(ToolCall(2, "create_ticket", R"({"title":"b"})"));
  ledger_->Flush();
  auto again = store_->QueryAttempts(AttemptFilter{.outcome = AttemptOutcome::kExecutedAgain});
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->empty());
}

TEST_F(McpSessionTest, TooManyCallsInFlightAreRefusedRetryably) {
  SessionOptions options;
  options.budget = std::make_shared<CallBudget>(1);
  StartSession(nullptr, options);
  client_.Inject(ToolCall(1, "slow_tool", R"({"n":1})"));
  upstream_.Await(IsCall("tools/call", 1));
  json::value r = Request(ToolCall(2, "slow_tool", R"({"n":2})"));
  EXPECT_EQ(r.at("error").at("code").as_int64(), kRpcOverloaded);
  server_.Answer("1", R"({"content":[]})");
  client_.Await(HasId(1));
}

TEST_F(McpSessionTest, ClientLeavingClosesTheUpstreamAndTheSessionEnds) {
  StartSession();
  Request(ToolCall(1, "create_ticket", "{}"));
  client_.InjectClose("client closed stdin");
  SessionEnd end = session_->Wait();
  EXPECT_FALSE(end.upstream_closed_first);
  EXPECT_EQ(end.client_reason, "client closed stdin");
  EXPECT_TRUE(upstream_.closed());
}

TEST_F(McpSessionTest, CallsRunningWhenTheClientLeavesAreStillStored) {
  StartSession();
  client_.Inject(ToolCall(1, "slow_tool", R"({"z":1})"));
  upstream_.Await(IsCall("tools/call", 1));
  upstream_.CloseAnswer(std::nullopt);  // the upstream stays up to finish its work
  client_.InjectClose("client closed stdin");
  client_.AwaitDelivered();
  server_.Answer("1", R"({"content":[{"type":"text","text":"finished"}]})");
  AwaitLog("executed: success, stored");
  upstream_.InjectClose("upstream exited with status 0");
  session_->Wait();
  auto record = store_->Get(RecordId{"default", KeyOf("slow_tool", R"({"z":1})", "turn-1")});
  ASSERT_TRUE(record && record->has_value());
  EXPECT_EQ((*record)->state, RecordState::kCompleted);
}

TEST_F(McpSessionTest, CallsSentJustBeforeTheClientLeftAreForwardedThenTheUpstreamClosed) {
  StartSession();
  client_.Inject(ToolCall(1, "create_ticket", R"({"title":"last words"})"));
  client_.Inject(R"({"jsonrpc":"2.0","id":2,"method":"ping"})");
  client_.InjectClose("client closed stdin", /*stops_reading=*/false);
  SessionEnd end = session_->Wait();
  EXPECT_FALSE(end.upstream_closed_first);
  // Had the upstream been closed first, the call could not have been sent.
  json::value answer = json::parse(client_.Await(HasId(1)));
  EXPECT_EQ(Text(answer, 0), "ticket #1");
  EXPECT_EQ(server_.executions("create_ticket"), 1);
  EXPECT_TRUE(upstream_.closed());
}

// ---- the stop (McpSession::Stop: a stop signal)

TEST_F(McpSessionTest, AStopWithNothingInFlightTerminatesTheUpstreamAndEnds) {
  StartSession();
  Request(ToolCall(1, "create_ticket", "{}"));
  session_->Stop();
  SessionEnd end = session_->Wait();
  EXPECT_FALSE(end.upstream_closed_first) << "the upstream closing is what the stop asked for";
  EXPECT_TRUE(upstream_.closed_now());
  EXPECT_TRUE(client_.closed());
  session_->Stop();  // idempotent, also once ended
}

TEST_F(McpSessionTest, AStopRefusesNewToolCallsAndLetsTheCallsInFlightSettle) {
  StartSession();
  client_.Inject(ToolCall(1, "slow_tool", R"({"s":1})"));
  upstream_.Await(IsCall("tools/call", 1));
  session_->Stop();
  // A call that comes once the stop began is refused, retryably, and never
  // reaches the upstream; a read-only one too (the upstream is going away).
  json::value refused = Request(ToolCall(2, "create_ticket", R"({"s":2})"));
  EXPECT_EQ(refused.at("error").at("code").as_int64(), kRpcStopping);
  EXPECT_EQ(refused.at("error").at("data").at("retryable"), true);
  EXPECT_NE(std::string(refused.at("error").at("message").as_string()).find("not executed"),
            std::string::npos);
  json::value search = Request(ToolCall(3, "search", "{}"));
  EXPECT_EQ(search.at("error").at("code").as_int64(), kRpcStopping);
  // Other requests still pass while the call in flight runs.
  client_.Inject(R"({"jsonrpc":"2.0","id":4,"method":"resources/read","params":{"uri":"a"}})");
  upstream_.Await(IsCall("resources/read", 4));
  EXPECT_EQ(server_.executions("create_ticket"), 0);
  EXPECT_EQ(server_.executions("search"), 0);
  EXPECT_FALSE(upstream_.closed()) << "the upstream stays up for the call in flight";

  server_.Answer("1", R"({"content":[{"type":"text","text":"settled in time"}]})");
  json::value answer = json::parse(client_.Await(HasId(1)));
  EXPECT_EQ(Text(answer, 0), "settled in time");
  SessionEnd end = session_->Wait();
  EXPECT_FALSE(end.upstream_closed_first);
  EXPECT_TRUE(upstream_.closed_now());
  auto record = store_->Get(RecordId{"default", KeyOf("slow_tool", R"({"s":1})", "turn-1")});
  ASSERT_TRUE(record && record->has_value());
  EXPECT_EQ((*record)->state, RecordState::kCompleted);
}

TEST_F(McpSessionTest, ACallStillRunningWhenTheStopGraceRunsOutBecomesUnknown) {
  config_.mcp.stop_grace = Duration(2'000);
  StartSession();
  client_.Inject(ToolCall(1, "slow_tool", R"({"g":1})"));
  upstream_.Await(IsCall("tools/call", 1));
  session_->Stop();
  clock_.AwaitWaiters(2);  // the lease keeper, and the stop waiting out its grace
  clock_.Advance(Duration(1'999));
  EXPECT_FALSE(upstream_.closed()) << "still within the grace";
  clock_.Advance(Duration(1));
  AwaitLog("1 tool call(s) still running after the stop grace of 2000 ms");
  json::value answer = json::parse(client_.Await(HasId(1)));
  EXPECT_EQ(answer.at("result").at("_meta").at("dev.idemgate/condition"), "outcome_unknown");
  EXPECT_NE(Text(answer, 0).find("idemgate stopped before the tool answered"), std::string::npos)
      << Text(answer, 0);
  session_->Wait();
  EXPECT_TRUE(upstream_.closed_now());
  auto record = store_->Get(RecordId{"default", KeyOf("slow_tool", R"({"g":1})", "turn-1")});
  ASSERT_TRUE(record && record->has_value());
  EXPECT_EQ((*record)->state, RecordState::kUnknown);
}

TEST_F(McpSessionTest, AnAnswerAfterTheStopGraceButBeforeTheUpstreamIsGoneStillSettles) {
  config_.mcp.stop_grace = Duration(0);
  upstream_.CloseAnswer(std::nullopt);  // the child takes a moment to exit
  StartSession();
  client_.Inject(ToolCall(1, "slow_tool", R"({"l":1})"));
  upstream_.Await(IsCall("tools/call", 1));
  session_->Stop();
  AwaitLog("outcome unknown: still running when the stop grace ran out");
  server_.Answer("1", R"({"content":[{"type":"text","text":"done just before exiting"}]})");
  AwaitLog("a late answer, after the call was given up, settled the record");
  upstream_.InjectClose("upstream was killed by SIGTERM");
  SessionEnd end = session_->Wait();
  EXPECT_FALSE(end.upstream_closed_first);
  auto record = store_->Get(RecordId{"default", KeyOf("slow_tool", R"({"l":1})", "turn-1")});
  ASSERT_TRUE(record && record->has_value());
  EXPECT_EQ((*record)->state, RecordState::kCompleted);
}

TEST_F(McpSessionTest, TheClientLeavingGivesTheUpstreamEofAndAStopThenTerminatesIt) {
  upstream_.CloseAnswer(std::nullopt);  // a server that does not exit on EOF
  StartSession();
  Request(ToolCall(1, "create_ticket", "{}"));
  client_.InjectClose("client closed stdin");
  upstream_.AwaitClosed();  // by the drain, on a worker
  EXPECT_FALSE(upstream_.closed_now()) << "end of input: EOF, as without the proxy";
  session_->Stop();  // the host's signal follows (the MCP SDK's close: EOF, then SIGTERM)
  EXPECT_TRUE(upstream_.closed_now());
  upstream_.InjectClose("upstream was killed by SIGTERM");
  EXPECT_FALSE(session_->Wait().upstream_closed_first);
}

TEST_F(McpSessionTest, BatchWithAToolCallIsSplitAndGated) {
  StartSession();
  client_.Inject("[" + ToolCall(1, "create_ticket", "{}") + "," +
                 ToolCall(2, "create_ticket", "{}") + "]");
  json::value a = json::parse(client_.Await(HasId(1)));
  json::value b = json::parse(client_.Await(HasId(2)));
  EXPECT_EQ(server_.executions("create_ticket"), 1);
  EXPECT_EQ(Text(a, 0), "ticket #1");
  EXPECT_EQ(Text(b, 0), "ticket #1");
}

}  // namespace
// The upstream's parser may read either copy of a duplicated "name": which
// tool ran would then depend on it. Refused, never forwarded ungated.
TEST_F(McpSessionTest, AToolNameSentTwiceIsRefusedAndNotForwarded) {
  StartSession();
  json::value r = Request(
      R"({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search","name":"create_ticket","arguments":{}}})");
  EXPECT_EQ(r.at("error").at("code").as_int64(), kRpcInvalidRequest);
  EXPECT_EQ(server_.executions("create_ticket"), 0);
  EXPECT_EQ(server_.executions("search"), 0);
}

TEST_F(McpSessionTest, ABatchWhoseToolCallSendsItsMethodTwiceIsSplitAndRefused) {
  StartSession();
  client_.Inject(
      R"([{"jsonrpc":"2.0","id":1,"method":"tools/call","method":"tools/call","params":{"name":"create_ticket","arguments":{}}}])");
  json::value a = json::parse(client_.Await(HasId(1)));
  // As for the same message alone: ParseMessage refuses a routing member
  // sent twice.
  EXPECT_EQ(a.at("error").at("code").as_int64(), kRpcParseError);
  EXPECT_EQ(server_.executions("create_ticket"), 0);
}

}  // namespace idem::mcp

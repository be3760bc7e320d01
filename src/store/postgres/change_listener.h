// LISTEN idemgate_changes on a dedicated connection, so that a record
// changed by another idemgate instance wakes this one's waiters at once.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "core/change_hub.h"
#include "idem/error.h"
#include "idem/record.h"
#include "pg_connection.h"
#include "postgres_url.h"

namespace idem::postgres {

// The channel every store writes its changes to, database-wide.
inline constexpr char kChangeChannel[] = "idemgate_changes";
// Where every eviction is announced (Store::WatchEvictions), with
// EvictionPayload(schema): evictions are rare, so one channel for all.
inline constexpr char kEvictionChannel[] = "idemgate_evictions";
std::string EvictionPayload(std::string_view schema);

// The payload announcing a change of `id` in `schema`: the schema's length,
// ':', the schema, then ChangeHub::KeyOf(id). Payloads are limited to 8000
// bytes; an id too long for one is announced as the schema's "*", which
// wakes every waiter of that schema.
std::string ChangePayload(std::string_view schema, const RecordId& id);

// One thread blocks in poll() on the LISTEN connection's socket and feeds
// the notifications for its schema into `hub`. When the connection drops it
// wakes every waiter (changes may be missed while it is down; they fall back
// to polling), reconnects with backoff, and wakes them all again once it
// listens again. Thread-safe; the destructor stops the thread.
class ChangeListener {
 public:
  // Connects and LISTENs before returning: kUnavailable if it cannot.
  static Result<std::unique_ptr<ChangeListener>> Start(const PostgresUrl& url, ChangeHub& hub);
  ~ChangeListener();
  ChangeListener(const ChangeListener&) = delete;
  ChangeListener& operator=(const ChangeListener&) = delete;

  // Whether the LISTEN connection is up right now.
  bool listening() const { return listening_.load(); }

  // Store::WatchEvictions: `on_change` now with whether we listen, (false)
  // when the connection drops, (true) once it listens again and for every
  // eviction in our schema. Runs on the listener thread (or here), one call
  // at a time; nullptr stops it and returns once no call is running.
  void WatchEvictions(std::function<void(bool heard)> on_change);

 private:
  ChangeListener(const PostgresUrl& url, ChangeHub& hub, int stop_fd);
  void Run(std::unique_ptr<Connection> conn);
  void Dispatch(std::string_view payload);
  // Sets listening_ and tells the eviction feed.
  void SetListening(bool listening);
  // Sleeps up to `ms` milliseconds; false if asked to stop.
  bool Pause(int ms);

  const PostgresUrl url_;
  ChangeHub& hub_;
  const int stop_fd_;         // eventfd, written once by the destructor
  const std::string prefix_;  // ChangePayload's schema part
  std::atomic<bool> listening_{false};  // changed under feed_mu_ once running
  std::mutex feed_mu_;                  // held while feed_ runs
  std::function<void(bool)> feed_;
  std::thread thread_;
};

}  // namespace idem::postgres

// Wakes WaitForChange callers (docs/DESIGN.md §4 step 3): writes through this
// store notify at once; writes by other processes arrive as pub/sub messages
// on the record's channel, read by one subscriber connection (one thread) per
// store. A channel is subscribed only while someone waits on it. A message
// lost to a broken subscriber connection only delays a waiter until its next
// poll. Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "idem/clock.h"
#include "redis_connection.h"

namespace idem::redis {

class ChangeListener {
 public:
  // `connect` opens the subscriber connection (retried with backoff while
  // it fails). In a cluster any node will do: PUBLISH reaches every node.
  explicit ChangeListener(std::function<Result<std::unique_ptr<Connection>>()> connect);
  ~ChangeListener();  // stops and joins the subscriber thread
  ChangeListener(const ChangeListener&) = delete;
  ChangeListener& operator=(const ChangeListener&) = delete;

  struct Channel;
  // Interest in one channel, held for the duration of one WaitForChange.
  class Watch {
   public:
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

    // Blocks (real time, at most `bound`) until the server confirmed the
    // subscription, so that a change made after this returns is announced
    // to us. Returns at once if the subscriber is disconnected. Returns
    // whether the subscription is confirmed.
    bool AwaitSubscribed(std::chrono::milliseconds bound);
    // Blocks until a change was signalled since the Watch was made or since
    // the previous call returned true, or until `until` by `clock`. Returns
    // whether a change was signalled.
    bool WaitUntil(Clock& clock, TimePoint until);

   private:
    friend class ChangeListener;
    Watch(ChangeListener* owner, std::string name, Channel* channel, uint64_t seen)
        : owner_(owner), name_(std::move(name)), channel_(channel), seen_(seen) {}
    ChangeListener* owner_;
    std::string name_;
    Channel* channel_;
    uint64_t seen_;
  };

  // Starts watching `channel`: local Notify calls wake the Watch at once;
  // messages on the channel wake it once the subscription is confirmed.
  std::unique_ptr<Watch> Subscribe(const std::string& channel);
  // Wakes the watchers of `channel` (a write through this store).
  void Notify(const std::string& channel);

  // Store::WatchEvictions on `channel`, where every eviction is published:
  // `on_change(false)` now and whenever the connection drops, (true) when
  // the subscription is confirmed (after every reconnect) and for every
  // message. Runs on the subscriber thread, one call at a time; nullptr
  // stops it and returns once no call is running.
  void WatchEvictions(const std::string& channel, std::function<void(bool heard)> on_change);

  // Whether the subscriber connection is up (for tests and logs).
  bool connected();

 private:
  void Run();
  void Wake();
  void NotifyAllLocked();
  // Returns whether the reply is news for the eviction feed (a message on,
  // or the confirmed subscription of, its channel).
  bool Handle(const redisReply& reply);
  void Feed(bool heard);

  std::function<Result<std::unique_ptr<Connection>>()> connect_;
  int wake_fd_ = -1;  // eventfd: new (un)subscriptions or stop

  std::mutex mu_;
  std::condition_variable acked_;  // a subscription was confirmed or the connection changed
  std::map<std::string, std::unique_ptr<Channel>> channels_;
  std::vector<std::pair<bool, std::string>> pending_;  // (subscribe?, channel) to send
  bool connected_ = false;
  bool stop_ = false;
  std::string feed_channel_;  // the eviction feed's, or empty

  std::mutex feed_mu_;  // held while feed_ runs
  std::function<void(bool)> feed_;
  std::unique_ptr<Watch> feed_watch_;  // keeps feed_channel_ subscribed
  std::thread thread_;
};

}  // namespace idem::redis

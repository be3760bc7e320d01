// In-process wake-ups for Store::WaitForChange, shared by the backends: fed
// by a store's own writes and, where the backend has them, by notifications
// of other instances' writes (PostgreSQL LISTEN).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "idem/clock.h"
#include "idem/record.h"

namespace idem {

// Tells the threads waiting on a record that it may have changed. Only
// records somebody waits on cost anything. Thread-safe.
class ChangeHub {
 public:
  // Interest in one record, held for the duration of one WaitForChange.
  class Watch {
   public:
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

    // Blocks until a change was signalled since the Watch was made or since
    // the previous call returned true, or until `until` by `clock`.
    // Returns whether a change was signalled.
    bool WaitUntil(Clock& clock, TimePoint until);

   private:
    friend class ChangeHub;
    struct Slot;
    Watch(ChangeHub* hub, std::string key, Slot* slot, uint64_t seen)
        : hub_(hub), key_(std::move(key)), slot_(slot), seen_(seen) {}

    ChangeHub* hub_;
    std::string key_;
    Slot* slot_;
    uint64_t seen_;
  };

  ChangeHub();
  ~ChangeHub();

  // The hub's name for a record: the tenant's length, ':', the tenant, the
  // key. No two (tenant, key) pairs share one. It may travel in notifications.
  static std::string KeyOf(const RecordId& id);

  // Starts watching `id`. Changes signalled from now on wake the Watch.
  std::unique_ptr<Watch> Subscribe(const RecordId& id);

  // Wakes the watchers of the record named `key` (KeyOf).
  void Notify(std::string_view key);
  // Wakes every watcher: notifications may have been lost.
  void NotifyAll();

 private:
  std::mutex mu_;
  std::unordered_map<std::string, std::unique_ptr<Watch::Slot>> slots_;
};

}  // namespace idem

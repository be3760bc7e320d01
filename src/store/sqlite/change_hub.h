// In-process wake-ups for WaitForChange.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "idem/clock.h"
#include "idem/record.h"

namespace idem::sqlite {

// Tells the threads waiting on a record that a write through the same store
// changed it. Only records somebody waits on cost anything. Thread-safe.
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

  // Starts watching `id`. Changes signalled from now on wake the Watch.
  std::unique_ptr<Watch> Subscribe(const RecordId& id);

  // Wakes the watchers of every record in `changed`.
  void Notify(const std::vector<RecordId>& changed);

 private:
  static std::string KeyOf(const RecordId& id);

  std::mutex mu_;
  std::unordered_map<std::string, std::unique_ptr<Watch::Slot>> slots_;
};

}  // namespace idem::sqlite

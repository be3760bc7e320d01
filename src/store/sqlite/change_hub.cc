#include "change_hub.h"

namespace idem::sqlite {

struct ChangeHub::Watch::Slot {
  std::condition_variable cv;
  uint64_t version = 0;
  int watchers = 0;
};

ChangeHub::ChangeHub() = default;
ChangeHub::~ChangeHub() = default;

std::string ChangeHub::KeyOf(const RecordId& id) {
  // Length-prefixed so that no two (tenant, key) pairs collide.
  return std::to_string(id.tenant.size()) + ":" + id.tenant + id.key;
}

std::unique_ptr<ChangeHub::Watch> ChangeHub::Subscribe(const RecordId& id) {
  std::string key = KeyOf(id);
  std::lock_guard lock(mu_);
  auto& slot = slots_[key];
  if (!slot) slot = std::make_unique<Watch::Slot>();
  ++slot->watchers;
  return std::unique_ptr<Watch>(new Watch(this, std::move(key), slot.get(), slot->version));
}

void ChangeHub::Notify(const std::vector<RecordId>& changed) {
  std::lock_guard lock(mu_);
  if (slots_.empty()) return;
  for (const RecordId& id : changed) {
    auto it = slots_.find(KeyOf(id));
    if (it == slots_.end()) continue;
    ++it->second->version;
    it->second->cv.notify_all();
  }
}

ChangeHub::Watch::~Watch() {
  std::lock_guard lock(hub_->mu_);
  if (--slot_->watchers == 0) hub_->slots_.erase(key_);
}

bool ChangeHub::Watch::WaitUntil(Clock& clock, TimePoint until) {
  for (;;) {
    {
      std::unique_lock lock(hub_->mu_);
      if (slot_->version == seen_) clock.WaitUntil(slot_->cv, lock, until);
      if (slot_->version != seen_) {
        seen_ = slot_->version;
        return true;
      }
    }
    // The clock is read without the hub's lock held: a FakeClock takes the
    // waiter's mutex when it advances.
    if (clock.Now() >= until) return false;
  }
}

}  // namespace idem::sqlite

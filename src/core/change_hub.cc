#include "core/change_hub.h"

namespace idem {

struct ChangeHub::Watch::Slot {
  std::condition_variable cv;
  uint64_t version = 0;
  int watchers = 0;
};

ChangeHub::ChangeHub() = default;
ChangeHub::~ChangeHub() = default;

std::string ChangeHub::KeyOf(const RecordId& id) {
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

void ChangeHub::Notify(std::string_view key) {
  std::lock_guard lock(mu_);
  if (slots_.empty()) return;
  auto it = slots_.find(std::string(key));
  if (it == slots_.end()) return;
  ++it->second->version;
  it->second->cv.notify_all();
}

void ChangeHub::NotifyAll() {
  std::lock_guard lock(mu_);
  for (auto& [key, slot] : slots_) {
    ++slot->version;
    slot->cv.notify_all();
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

}  // namespace idem

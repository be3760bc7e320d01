#include "observe/store_probe.h"

namespace idem {

StoreProbe::StoreProbe(Store& store, Clock& clock, Duration timeout)
    : store_(store), clock_(clock), timeout_(timeout), thread_([this] { Loop(); }) {}

StoreProbe::~StoreProbe() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Result<void> StoreProbe::Check() {
  std::unique_lock lock(mu_);
  if (requested_ != answered_) {
    return MakeError(ErrorCode::kDeadlineExceeded,
                     "the store has not answered an earlier readiness read yet");
  }
  const uint64_t mine = ++requested_;
  cv_.notify_all();
  const TimePoint deadline = clock_.Now() + timeout_;
  while (answered_ < mine && clock_.Now() < deadline) clock_.WaitUntil(cv_, lock, deadline);
  if (answered_ < mine) {
    return MakeError(ErrorCode::kDeadlineExceeded,
                     "the store did not answer within " + std::to_string(timeout_.count()) + " ms");
  }
  return last_;
}

void StoreProbe::Loop() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || requested_ != answered_; });
    if (stop_) return;
    const uint64_t serving = requested_;
    lock.unlock();
    auto got = store_.Get(RecordId{"idemgate", "readyz-probe"});
    lock.lock();
    last_ = got ? Result<void>() : std::unexpected(got.error());
    answered_ = serving;
    cv_.notify_all();
  }
}

}  // namespace idem

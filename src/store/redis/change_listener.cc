#include "change_listener.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

namespace idem::redis {

// One channel somebody waits on (or that is being unsubscribed).
struct ChangeListener::Channel {
  std::condition_variable cv;  // watchers wait here
  uint64_t version = 0;        // bumped on every change signal
  int watchers = 0;
  // (Un)subscribe commands queued on the current connection, and the
  // confirmations read back. The subscription is live when they are equal
  // and the last one was a SUBSCRIBE.
  uint64_t ops_sent = 0;
  uint64_t ops_acked = 0;
  bool subscribed = false;
};

ChangeListener::ChangeListener(std::function<Result<std::unique_ptr<Connection>>()> connect)
    : connect_(std::move(connect)), wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  thread_ = std::thread([this] { Run(); });
}

ChangeListener::~ChangeListener() {
  WatchEvictions({}, nullptr);
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  Wake();
  acked_.notify_all();
  thread_.join();
  if (wake_fd_ >= 0) close(wake_fd_);
}

void ChangeListener::Wake() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof one);
}

void ChangeListener::WatchEvictions(const std::string& channel,
                                    std::function<void(bool heard)> on_change) {
  std::unique_ptr<Watch> old;
  const bool on = static_cast<bool>(on_change);
  {
    std::lock_guard feed(feed_mu_);
    feed_ = std::move(on_change);
    old = std::move(feed_watch_);
    // Unheard until the subscription is confirmed.
    if (feed_) feed_(false);
  }
  {
    std::lock_guard lock(mu_);
    feed_channel_ = on ? channel : std::string();
  }
  // After feed_channel_ is set, so that the confirmation is recognised.
  if (on) {
    auto watch = Subscribe(channel);
    std::lock_guard feed(feed_mu_);
    feed_watch_ = std::move(watch);
  }
}

void ChangeListener::Feed(bool heard) {
  std::lock_guard feed(feed_mu_);
  if (feed_) feed_(heard);
}

bool ChangeListener::connected() {
  std::lock_guard lock(mu_);
  return connected_;
}

std::unique_ptr<ChangeListener::Watch> ChangeListener::Subscribe(const std::string& name) {
  bool wake = false;
  std::unique_ptr<Watch> watch;
  {
    std::lock_guard lock(mu_);
    auto& ch = channels_[name];
    if (!ch) ch = std::make_unique<Channel>();
    if (ch->watchers++ == 0 && connected_) {
      // First watcher (or first again while an UNSUBSCRIBE is in flight).
      ++ch->ops_sent;
      pending_.emplace_back(true, name);
      wake = true;
    }
    watch.reset(new Watch(this, name, ch.get(), ch->version));
  }
  if (wake) Wake();
  return watch;
}

ChangeListener::Watch::~Watch() {
  bool wake = false;
  {
    std::lock_guard lock(owner_->mu_);
    if (--channel_->watchers == 0) {
      if (owner_->connected_ && channel_->subscribed) {
        ++channel_->ops_sent;
        owner_->pending_.emplace_back(false, name_);
        wake = true;
      } else if (channel_->ops_sent == channel_->ops_acked) {
        owner_->channels_.erase(name_);
      }
      // else: a SUBSCRIBE is in flight; Handle unsubscribes when it lands.
    }
  }
  if (wake) owner_->Wake();
}

bool ChangeListener::Watch::AwaitSubscribed(std::chrono::milliseconds bound) {
  std::unique_lock lock(owner_->mu_);
  // Real time on purpose: this waits for a network round trip, not for
  // anything a Clock decides.
  return owner_->acked_.wait_for(
             lock, bound,
             [&] {
               return owner_->stop_ || !owner_->connected_ ||
                      (channel_->subscribed && channel_->ops_acked == channel_->ops_sent);
             }) &&
         owner_->connected_ && channel_->subscribed;
}

bool ChangeListener::Watch::WaitUntil(Clock& clock, TimePoint until) {
  for (;;) {
    {
      std::unique_lock lock(owner_->mu_);
      if (channel_->version == seen_) clock.WaitUntil(channel_->cv, lock, until);
      if (channel_->version != seen_) {
        seen_ = channel_->version;
        return true;
      }
    }
    // The clock is read without our lock held: a FakeClock takes the
    // waiter's mutex when it advances.
    if (clock.Now() >= until) return false;
  }
}

void ChangeListener::Notify(const std::string& name) {
  std::lock_guard lock(mu_);
  auto it = channels_.find(name);
  if (it == channels_.end()) return;
  ++it->second->version;
  it->second->cv.notify_all();
}

void ChangeListener::NotifyAllLocked() {
  for (auto& [name, ch] : channels_) {
    ++ch->version;
    ch->cv.notify_all();
  }
}

bool ChangeListener::Handle(const redisReply& reply) {
  if (reply.type != REDIS_REPLY_ARRAY || reply.elements < 2) return false;
  const std::string_view kind = Text(*reply.element[0]);
  const std::string name(Text(*reply.element[1]));
  std::lock_guard lock(mu_);
  const bool news =
      !feed_channel_.empty() && name == feed_channel_ && (kind == "message" || kind == "subscribe");
  auto it = channels_.find(name);
  if (it == channels_.end()) return news;
  Channel& ch = *it->second;
  if (kind == "message") {
    ++ch.version;
    ch.cv.notify_all();
  } else if (kind == "subscribe" || kind == "unsubscribe") {
    ++ch.ops_acked;
    ch.subscribed = kind == "subscribe";
    if (ch.ops_acked == ch.ops_sent) {
      if (ch.watchers == 0 && ch.subscribed) {
        ++ch.ops_sent;  // the last watcher left while the SUBSCRIBE was in flight
        pending_.emplace_back(false, name);
      } else if (ch.watchers == 0) {
        channels_.erase(it);
      }
    }
    acked_.notify_all();
  }
  return news;
}

void ChangeListener::Run() {
  std::unique_ptr<Connection> conn;
  int failures = 0;
  for (;;) {
    if (!conn) {
      {
        std::lock_guard lock(mu_);
        if (stop_) return;
      }
      auto c = connect_();
      if (!c) {
        ++failures;
        // Back off 50 ms doubling to 2 s, waking early to stop. Waiters poll
        // meanwhile.
        const auto delay =
            std::chrono::milliseconds(std::min(50 << std::min(failures - 1, 6), 2000));
        pollfd p{wake_fd_, POLLIN, 0};
        poll(&p, 1, static_cast<int>(delay.count()));
        uint64_t drained;
        [[maybe_unused]] ssize_t n = read(wake_fd_, &drained, sizeof drained);
        continue;
      }
      failures = 0;
      conn = std::move(*c);
      std::lock_guard lock(mu_);
      connected_ = true;
      pending_.clear();
      for (auto it = channels_.begin(); it != channels_.end();) {
        Channel& ch = *it->second;
        ch.ops_sent = ch.ops_acked = 0;
        ch.subscribed = false;
        if (ch.watchers == 0) {
          it = channels_.erase(it);
          continue;
        }
        ch.ops_sent = 1;
        pending_.emplace_back(true, it->first);
        ++it;
      }
      // Changes made while we were away were not announced: everyone re-reads.
      NotifyAllLocked();
    }

    std::vector<std::pair<bool, std::string>> ops;
    {
      std::lock_guard lock(mu_);
      if (stop_) return;
      ops.swap(pending_);
    }
    for (const auto& [subscribe, name] : ops) {
      conn->Append({subscribe ? "SUBSCRIBE" : "UNSUBSCRIBE", name});
    }
    bool lost = !ops.empty() && !conn->Flush();
    if (!lost) {
      pollfd fds[2] = {{conn->fd(), POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      if (poll(fds, 2, -1) < 0) continue;  // EINTR
      if (fds[1].revents) {
        uint64_t drained;
        [[maybe_unused]] ssize_t n = read(wake_fd_, &drained, sizeof drained);
      }
      if (fds[0].revents) {
        auto replies = conn->ReadAvailable();
        if (!replies) {
          lost = true;
        } else {
          bool news = false;
          for (const Reply& r : *replies) news = Handle(*r) || news;
          if (news) Feed(true);
        }
      }
    }
    if (lost) {
      conn.reset();
      {
        std::lock_guard lock(mu_);
        connected_ = false;
        for (auto& [name, ch] : channels_) ch->subscribed = false;
        acked_.notify_all();
      }
      Feed(false);
    }
  }
}

}  // namespace idem::redis

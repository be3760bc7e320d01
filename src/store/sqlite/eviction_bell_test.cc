// Evictions reaching the replay caches of other processes on one SQLite
// file. Two SqliteStore objects on one file stand for two processes: each
// has its own inotify instance, as each process would.
#include "eviction_bell.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "idem/caching_store.h"
#include "sqlite_store.h"
#include "test_support.h"

namespace idem {
namespace {

namespace fs = std::filesystem;
using testing::Eventually;
using testing::kTtl;
using testing::Req;

// What a store's eviction feed has said, in order.
class FeedLog {
 public:
  Store::EvictionFeed Feed() {
    return [this](bool heard) {
      std::lock_guard g(mu_);
      said_.push_back(heard);
    };
  }
  std::vector<bool> said() const {
    std::lock_guard g(mu_);
    return said_;
  }
  size_t heard() const {
    std::lock_guard g(mu_);
    return static_cast<size_t>(std::count(said_.begin(), said_.end(), true));
  }

 private:
  mutable std::mutex mu_;
  std::vector<bool> said_;
};

class EvictionBellTest : public testing::SqliteFileTest {
 protected:
  // Claims and completes `key` through `store`.
  static void Finish(Store& store, const std::string& key) {
    auto claimed = store.Claim(Req(key));
    ASSERT_TRUE(claimed && claimed->claimed);
    ASSERT_TRUE(store.Complete(claimed->record.id, claimed->record.fence,
                               Outcome{OutcomeClass::kSuccess, "charged"}, kTtl));
  }
};

TEST_F(EvictionBellTest, AnEvictionThroughAnotherStoreOnTheFileIsHeard) {
  auto watcher = Open();
  auto other = Open();
  FeedLog log;
  ASSERT_TRUE(watcher->WatchEvictions(log.Feed()));
  EXPECT_EQ(log.said(), std::vector<bool>{true});  // up before WatchEvictions returns
  EXPECT_TRUE(fs::exists(sqlite::EvictionBellPath(path_)));
  Finish(*other, "k");
  EXPECT_EQ(log.heard(), 1u);  // a claim and a completion ring nothing

  auto evicted = other->Evict(Req("k").id);
  ASSERT_TRUE(evicted) << evicted.error().ToString();
  EXPECT_TRUE(*evicted);
  ASSERT_TRUE(Eventually([&] { return log.heard() >= 2; }));
  EXPECT_EQ(log.said().front(), true);
  ASSERT_TRUE(watcher->WatchEvictions(nullptr));
}

TEST_F(EvictionBellTest, AProcessThatNamesTheFileThroughASymbolicLinkRingsTheSameBell) {
  auto watcher = Open();
  const std::string link = dir_.File("link.db");
  fs::create_symlink(path_, link);
  auto through_link = SqliteStore::Open(link, clock_, {});
  ASSERT_TRUE(through_link) << through_link.error().ToString();
  EXPECT_EQ(sqlite::EvictionBellPath(link), sqlite::EvictionBellPath(path_));
  FeedLog log;
  ASSERT_TRUE(watcher->WatchEvictions(log.Feed()));
  ASSERT_TRUE((*through_link)->Evict(Req("k").id));
  ASSERT_TRUE(Eventually([&] { return log.heard() >= 2; }));
  EXPECT_FALSE(fs::exists(link + "-evictions"));
}

TEST_F(EvictionBellTest, AReplayCacheAboveTheFileStopsReplayingOnceAnotherProcessEvicts) {
  auto mine = Open();
  auto other = Open();
  CachingStore cache(*mine, clock_, 1 << 20);
  ASSERT_TRUE(cache.active());
  Finish(cache, "k");
  auto retry = cache.Claim(Req("k"));
  ASSERT_TRUE(retry);
  EXPECT_FALSE(retry->claimed);
  EXPECT_EQ(cache.stats().hits, 1u);  // answered from memory

  const uint64_t drops = cache.stats().drops;
  ASSERT_TRUE(other->Evict(Req("k").id));
  ASSERT_TRUE(Eventually([&] { return cache.stats().drops > drops; }));
  auto again = cache.Claim(Req("k"));
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->claimed) << "the evicted outcome was replayed from the cache";
}

TEST_F(EvictionBellTest, ABellFileRemovedIsWatchedAgainOnceTheNextEvictionMakesIt) {
  auto watcher = Open();
  auto other = Open();
  FeedLog log;
  ASSERT_TRUE(watcher->WatchEvictions(log.Feed()));
  ASSERT_TRUE(fs::remove(sqlite::EvictionBellPath(path_)));
  // Deaf, and the file is not made again behind the back of whoever
  // removed it (it may be removing the whole directory).
  ASSERT_TRUE(Eventually([&] { return log.said().size() >= 2; }));
  EXPECT_EQ(log.said(), (std::vector<bool>{true, false}));
  EXPECT_FALSE(fs::exists(sqlite::EvictionBellPath(path_)));
  // The next eviction makes it; the watcher finds it, and hears the next.
  ASSERT_TRUE(other->Evict(Req("gone").id));
  ASSERT_TRUE(Eventually([&] { return log.heard() >= 2; }));
  ASSERT_TRUE(other->Evict(Req("gone again").id));
  ASSERT_TRUE(Eventually([&] { return log.heard() >= 3; }));
}

TEST_F(EvictionBellTest, ABellThatCannotRingFailsTheEvictionLoudlyAndTheRecordIsStillGone) {
  auto store = Open();
  Finish(*store, "k");
  ASSERT_TRUE(fs::create_directory(sqlite::EvictionBellPath(path_)));
  FeedLog log;
  EXPECT_FALSE(store->WatchEvictions(log.Feed())) << "watched a directory";
  EXPECT_TRUE(log.said().empty());

  auto evicted = store->Evict(Req("k").id);
  ASSERT_FALSE(evicted);
  EXPECT_NE(evicted.error().message.find("evict it again"), std::string::npos)
      << evicted.error().ToString();
  EXPECT_NE(evicted.error().message.find("-evictions"), std::string::npos);
  auto left = store->Get(Req("k").id);
  ASSERT_TRUE(left);
  EXPECT_FALSE(*left);
  // Nothing lost: the store goes on claiming and completing.
  Finish(*store, "k2");
}

TEST_F(EvictionBellTest, AStoppedWatcherCanBeStartedAgain) {
  auto watcher = Open();
  auto other = Open();
  FeedLog first;
  FeedLog second;
  ASSERT_TRUE(watcher->WatchEvictions(first.Feed()));
  ASSERT_TRUE(watcher->WatchEvictions(nullptr));
  ASSERT_TRUE(watcher->WatchEvictions(second.Feed()));
  ASSERT_TRUE(other->Evict(Req("k").id));
  ASSERT_TRUE(Eventually([&] { return second.heard() >= 2; }));
  EXPECT_EQ(first.said(), std::vector<bool>{true});
}

}  // namespace
}  // namespace idem

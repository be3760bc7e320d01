// Helpers shared by the SQLite store's tests: a temporary directory, a
// claim request, and a bounded wait for a condition.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <thread>

#include "idem/clock.h"
#include "idem/store.h"
#include "sqlite_store.h"

namespace idem::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/idem_sqlite_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string File(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline constexpr Duration kLease = std::chrono::seconds(30);
inline constexpr Duration kTtl = std::chrono::hours(24);

// A claim of `key` in tenant "default" with kLease and kTtl.
inline ClaimRequest Req(const std::string& key) {
  ClaimRequest r;
  r.id = RecordId{"default", key};
  r.fingerprint = "fp";
  r.tool = "charge";
  r.turn = "turn-1";
  r.lease = kLease;
  r.retention = kTtl;
  return r;
}

// Blocks until `done()` holds, yielding; fails the test instead of hanging
// if it never does. Not a timing assumption: the bound only turns a hang
// into a failure.
template <typename Pred>
bool Eventually(Pred done) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!done()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::yield();
  }
  return true;
}

// A test of stores on one SQLite file in a fresh directory, with a fake
// clock: Open opens another store on it (another process, as far as the
// file is concerned), with PARAMS appended to the path ("?shared_writer=off").
class SqliteFileTest : public ::testing::Test {
 protected:
  std::unique_ptr<SqliteStore> Open(const std::string& params = "",
                                    const StoreOptions& options = {}) {
    auto store = SqliteStore::Open(path_ + params, clock_, options);
    EXPECT_TRUE(store) << store.error().ToString();
    return store ? std::move(*store) : nullptr;
  }

  TempDir dir_;
  std::string path_ = dir_.File("idem.db");
  FakeClock clock_;
};

}  // namespace idem::testing

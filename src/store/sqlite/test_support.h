// Helpers shared by the SQLite store's tests: a temporary directory, a
// claim request, and a bounded wait for a condition.
#pragma once

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <thread>

#include "idem/store.h"

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

}  // namespace idem::testing

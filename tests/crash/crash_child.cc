// A process that makes one call through the ledger on a SQLite file and
// SIGKILLs itself at a chosen point, for crash_test.cc.
//
//   crash_child DB KEY SIDE_EFFECT_FILE POINT
//
// POINT: after_claim | after_execute | after_complete | none
// The side effect is one line appended (and fsynced) to SIDE_EFFECT_FILE, as
// an upstream's own log would record a charge.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "idem/ledger.h"
#include "idem/store.h"

namespace {

void Die() {
  std::fflush(nullptr);
  raise(SIGKILL);
}

void SideEffect(const std::string& path, const std::string& line) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  if (fd < 0) std::abort();
  std::string l = line + "\n";
  if (write(fd, l.data(), l.size()) != static_cast<ssize_t>(l.size())) std::abort();
  fsync(fd);
  close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: crash_child DB KEY SIDE_EFFECT_FILE POINT\n");
    return 2;
  }
  const std::string db = argv[1], key = argv[2], effects = argv[3], point = argv[4];
  auto store = idem::OpenStore("sqlite:" + db, idem::SystemClock::Default());
  if (!store) {
    std::fprintf(stderr, "crash_child: %s\n", store.error().ToString().c_str());
    return 1;
  }
  idem::Ledger ledger(**store, idem::SystemClock::Default(), {"crash-child", nullptr, false});
  idem::Call call;
  call.id = idem::RecordId{"default", key};
  call.fingerprint = "fp";
  call.tool = "charge";
  call.turn = "turn-1";
  auto d = ledger.Begin(call);
  if (!d) {
    std::fprintf(stderr, "crash_child: begin: %s\n", d.error().ToString().c_str());
    return 1;
  }
  if (d->kind != idem::Decision::Kind::kExecute) {
    std::printf("%s\n", std::string(idem::DecisionKindName(d->kind)).c_str());
    return 0;
  }
  if (point == "after_claim") Die();
  SideEffect(effects, "charged " + key);
  if (point == "after_execute") Die();
  auto done = ledger.Complete(call, *d, idem::Outcome{idem::OutcomeClass::kSuccess, "ch_1"});
  if (!done) {
    std::fprintf(stderr, "crash_child: complete: %s\n", done.error().ToString().c_str());
    return 1;
  }
  if (point == "after_complete") Die();
  std::printf("executed\n");
  return 0;
}

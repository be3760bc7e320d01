#include "core/fault_point.h"

#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <string>

namespace idem {
namespace {

constexpr std::array<std::string_view, 5> kPoints = {
    "after_claim", "after_send", "after_answer", "after_persist", "before_reply"};

constexpr const char* kVariable = "IDEMGATE_FAULT_POINT";

// IDEMGATE_FAULT_POINT parsed: the point and which passage of it kills.
struct Setting {
  std::string point;  // empty: none set
  long passage = 1;
  std::string error;  // why the setting is invalid, if it is
};

Setting Parse() {
  Setting s;
  const char* raw = std::getenv(kVariable);
  if (raw == nullptr || *raw == '\0') return s;
  std::string_view text = raw;
  std::string_view count;
  if (size_t at = text.find('@'); at != std::string_view::npos) {
    count = text.substr(at + 1);
    text = text.substr(0, at);
  }
  s.point = std::string(text);
  bool known = false;
  for (std::string_view p : kPoints) known = known || p == text;
  if (!known) {
    s.error = std::string(kVariable) + "=" + raw + ": unknown point \"" + s.point +
              "\"; expected after_claim, after_send, after_answer, after_persist or before_reply";
  }
  if (!count.empty()) {
    auto [end, ec] = std::from_chars(count.data(), count.data() + count.size(), s.passage);
    if (ec != std::errc() || end != count.data() + count.size() || s.passage < 1) {
      s.error = std::string(kVariable) + "=" + raw + ": the count after @ must be a whole number >= 1";
    }
  }
  return s;
}

const Setting& TheSetting() {
  static const Setting setting = Parse();
  return setting;
}

std::atomic<bool> armed{false};

}  // namespace

void ArmFaultPoints() { armed.store(true, std::memory_order_relaxed); }

bool FaultPointsArmed() { return armed.load(std::memory_order_relaxed); }

void FaultPoint(std::string_view name) {
  if (!FaultPointsArmed()) return;
  static std::atomic<long> passages{0};
  const Setting& s = TheSetting();
  if (s.point.empty() || !s.error.empty() || s.point != name) return;
  if (passages.fetch_add(1) + 1 != s.passage) return;
  std::string line = "idemgate: fault point " + s.point + " reached: SIGKILL\n";
  (void)::write(STDERR_FILENO, line.data(), line.size());
  ::kill(::getpid(), SIGKILL);
}

Result<void> CheckFaultPointSetting() {
  const Setting& s = TheSetting();
  if (s.point.empty()) return {};
  if (!FaultPointsArmed()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     std::string(kVariable) +
                         " is set, but this build has no fault points (they are for the crash "
                         "tests: configure with -DIDEM_FAULT_POINTS=ON); unset it");
  }
  if (!s.error.empty()) return MakeError(ErrorCode::kInvalidArgument, s.error);
  return {};
}

}  // namespace idem

// Test helper: whether a Prometheus exposition holds one exact line.
#pragma once

#include <string>

namespace idem {

inline bool Has(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

}  // namespace idem

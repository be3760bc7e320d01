// The MCP front's diagnostics: one line to stderr, "idemgate: WHO: MESSAGE",
// written whole so that threads' lines do not interleave (stdout carries
// only MCP messages). Safe from any thread.
#pragma once

#include <iostream>
#include <string>
#include <string_view>

namespace idem::mcp {

inline void LogLine(std::string_view who, std::string_view message) {
  std::string line = "idemgate: ";
  line.append(who).append(": ").append(message).push_back('\n');
  std::cerr << line << std::flush;
}

}  // namespace idem::mcp

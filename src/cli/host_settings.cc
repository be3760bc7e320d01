// The rules that the JSON and the TOML edits of host settings share: what a
// wrapped server and idemgate's hook look like, and the messages about them.
#include <string>
#include <string_view>
#include <vector>

#include "host_settings.h"

namespace idem::cli {
namespace {

std::string_view Basename(std::string_view path) {
  size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

// Safe unquoted in sh: everything else gets single quotes.
bool IsPlainShellWord(std::string_view word) {
  if (word.empty()) return false;
  for (char c : word) {
    bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 std::string_view("_/.:=@%+,-").find(c) != std::string_view::npos;
    if (!plain) return false;
  }
  return true;
}

std::string ShellQuote(std::string_view word) {
  if (IsPlainShellWord(word)) return std::string(word);
  std::string out = "'";
  for (char c : word) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// The first two words of a shell command line, with simple quotes removed:
// enough to recognise `'/path/to/idemgate' hook …`.
std::vector<std::string> FirstWords(std::string_view line, size_t count) {
  std::vector<std::string> words;
  size_t i = 0;
  while (i < line.size() && words.size() < count) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    if (i >= line.size()) break;
    std::string word;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t') {
      char c = line[i++];
      if (c == '\'' || c == '"') {
        size_t close = line.find(c, i);
        if (close == std::string_view::npos) close = line.size();
        word.append(line.substr(i, close - i));
        i = close < line.size() ? close + 1 : close;
      } else {
        word += c;
      }
    }
    words.push_back(std::move(word));
  }
  return words;
}

}  // namespace

std::string HookCommand(const std::string& idemgate, const std::vector<std::string>& options) {
  std::string line = ShellQuote(idemgate) + " hook";
  for (const std::string& option : options) line += " " + ShellQuote(option);
  return line;
}

namespace host_settings {

bool IsWrapped(std::string_view command, const std::vector<std::string>& args) {
  return Basename(command) == "idemgate" && !args.empty() && args.front() == "mcp";
}

size_t OriginalCommandIndex(const std::vector<std::string>& args) {
  for (size_t i = 1; i + 1 < args.size(); ++i) {
    if (args[i] == "--") return i + 1;
  }
  return std::string::npos;
}

std::vector<std::string> WrappedArgs(const ServerEdit& edit, std::string_view command,
                                     const std::vector<std::string>& args) {
  std::vector<std::string> wrapped{"mcp"};
  wrapped.insert(wrapped.end(), edit.options.begin(), edit.options.end());
  wrapped.push_back("--");
  wrapped.emplace_back(command);
  wrapped.insert(wrapped.end(), args.begin(), args.end());
  return wrapped;
}

bool IsIdemgateHookCommand(std::string_view command) {
  std::vector<std::string> words = FirstWords(command, 2);
  return words.size() == 2 && Basename(words[0]) == "idemgate" && words[1] == "hook";
}

std::string UnknownServerMessage(std::string_view name, std::string_view source,
                                 const std::vector<std::string>& known) {
  std::string message = "no MCP server named \"" + std::string(name) + "\" in " +
                        std::string(source) + "; it has";
  if (known.empty()) return message + " none";
  message += ": ";
  for (size_t i = 0; i < known.size(); ++i) {
    if (i > 0) message += ", ";
    message += known[i];
  }
  return message;
}

std::string HttpServerNote(std::string_view name, std::string_view source) {
  return std::string(source) + ": server \"" + std::string(name) +
         "\" is reached over HTTP, left as it is; to gate it, run `idemgate mcp --listen ADDR "
         "--upstream-url URL` in front of it and point the host at ADDR (docs/hosts.md)";
}

}  // namespace host_settings
}  // namespace idem::cli

// Codex's config.toml, edited in place: toml++ parses the text (to validate
// it and to find each `[mcp_servers.NAME]` table and where its `command` and
// `args` values are), and only those bytes are spliced; comments, layout and
// every other table stay byte for byte.
//
// Wrapping copies the original command's bytes into `args` as they were
// written, so unwrapping copies them back: the original text returns exactly.
// The wrapped prefix goes before the first original argument (after `[` for an
// empty array), and unwrapping removes exactly that range. A server without
// `args` gets a line of its own, marked with a comment, which unwrapping removes.
#include <toml++/toml.h>

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "host_settings.h"

namespace idem::cli {
namespace {

using namespace host_settings;

constexpr std::string_view kAddedMarker = "  # added by idemgate install";

// Byte offsets of toml++ source positions (1-based lines, columns counted in
// characters, end positions exclusive).
class Positions {
 public:
  explicit Positions(std::string_view text) : text_(text) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '\n') line_starts_.push_back(i + 1);
    }
  }
  size_t Offset(const toml::source_position& p) const {
    if (p.line == 0 || p.line > line_starts_.size()) return text_.size();
    size_t i = line_starts_[p.line - 1];
    for (size_t column = 1; column < p.column && i < text_.size() && text_[i] != '\n';) {
      ++i;
      if (i >= text_.size() || (static_cast<unsigned char>(text_[i]) & 0xC0) != 0x80) ++column;
    }
    return i;
  }
  size_t LineStart(size_t offset) const {
    size_t nl = offset == 0 ? std::string_view::npos : text_.rfind('\n', offset - 1);
    return nl == std::string_view::npos ? 0 : nl + 1;
  }
  // The offset just past the '\n' ending the line of `offset` (text size if none).
  size_t NextLine(size_t offset) const {
    size_t nl = text_.find('\n', offset);
    return nl == std::string_view::npos ? text_.size() : nl + 1;
  }

 private:
  std::string_view text_;
  std::vector<size_t> line_starts_;
};

struct Span {
  size_t begin = 0;
  size_t end = 0;
};

struct Splice {
  size_t begin = 0;
  size_t end = 0;
  std::string text;
};

Span SpanOf(const Positions& at, const toml::source_region& region) {
  return {at.Offset(region.begin), at.Offset(region.end)};
}

// A TOML basic string holding `s`.
std::string TomlQuote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\t': out += "\\t"; break;
      case '\n': out += "\\n"; break;
      case '\f': out += "\\f"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          char buffer[8];
          std::snprintf(buffer, sizeof buffer, "\\u%04X", static_cast<unsigned>(c));
          out += buffer;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string Where(std::string_view source, const toml::source_region& region) {
  return std::string(source) + ":" + std::to_string(region.begin.line) + ":" +
         std::to_string(region.begin.column);
}

// The `mcp`, options and `--` elements, then the original command's own bytes.
std::string WrappedPrefix(const ServerEdit& edit, std::string_view command_text) {
  std::string prefix = TomlQuote("mcp") + ", ";
  for (const std::string& option : edit.options) prefix += TomlQuote(option) + ", ";
  return prefix + TomlQuote("--") + ", " + std::string(command_text);
}

// The key of `name` in `table`, with its source region.
const toml::key* KeyOf(const toml::table& table, std::string_view name) {
  auto it = table.find(name);
  return it == table.end() ? nullptr : &it->first;
}

// Plans the splices that wrap or unwrap one server; false with a note if it
// is left as it is, an error if it cannot be edited safely.
Result<bool> PlanServer(std::string_view text, const Positions& at, const std::string& name,
                        const toml::node& node, const ServerEdit& edit, std::string_view source,
                        std::vector<Splice>& splices, std::vector<std::string>& notes) {
  const toml::table* table = node.as_table();
  if (table == nullptr) {
    notes.push_back(std::string(source) + ": mcp_servers." + name +
                    " is not a table, left as it is");
    return false;
  }
  const toml::node* command = table->get("command");
  if (command == nullptr) {
    if (table->contains("url")) {
      if (edit.action == InstallAction::kInstall) notes.push_back(HttpServerNote(name, source));
    } else {
      notes.push_back(std::string(source) + ": server \"" + name +
                      "\" has no command, left as it is");
    }
    return false;
  }
  const toml::node* args_node = table->get("args");
  const toml::array* args = args_node ? args_node->as_array() : nullptr;
  std::vector<std::string> arg_values;
  bool strings = command->is_string() && (args_node == nullptr || args != nullptr);
  if (args != nullptr) {
    for (const toml::node& e : *args) {
      if (!e.is_string()) strings = false;
      else arg_values.push_back(e.as_string()->get());
    }
  }
  if (!strings) {
    notes.push_back(Where(source, command->source()) + ": server \"" + name +
                    "\" has a command that is not a string or args that are not strings, left "
                    "as it is");
    return false;
  }
  std::string command_value = command->as_string()->get();
  bool wrapped = IsWrapped(command_value, arg_values);
  Span command_span = SpanOf(at, command->source());

  if (edit.action == InstallAction::kInstall) {
    if (wrapped) return false;
    std::string prefix = WrappedPrefix(
        edit, text.substr(command_span.begin, command_span.end - command_span.begin));
    splices.push_back({command_span.begin, command_span.end, TomlQuote(edit.idemgate)});
    if (args != nullptr) {
      if (args->empty()) {
        size_t open = SpanOf(at, args->source()).begin + 1;
        splices.push_back({open, open, prefix});
      } else {
        size_t first = SpanOf(at, (*args)[0].source()).begin;
        splices.push_back({first, first, prefix + ", "});
      }
      return true;
    }
    if (table->is_inline()) {
      return MakeError(ErrorCode::kInvalidArgument,
                       Where(source, command->source()) + ": server \"" + name +
                           "\" is an inline table without `args`, which cannot be extended in "
                           "place; add `args = []` to it (or make it a [mcp_servers." +
                           name + "] table) and run again");
    }
    // A line of its own after the command's, keyed as the command is (dotted
    // keys included: `x.command` gets `x.args`).
    const toml::key* key = KeyOf(*table, "command");
    size_t key_begin = at.Offset(key->source().begin);
    size_t line = at.LineStart(key_begin);
    size_t after = at.NextLine(command_span.end);
    std::string added = std::string(text.substr(line, key_begin - line)) + "args = [" + prefix +
                        "]" + std::string(kAddedMarker) + "\n";
    if (after == text.size() && (text.empty() || text.back() != '\n')) added = "\n" + added;
    splices.push_back({after, after, added});
    return true;
  }

  if (!wrapped) return false;
  size_t original = OriginalCommandIndex(arg_values);
  if (original == std::string::npos) {
    notes.push_back(std::string(source) + ": server \"" + name +
                    "\" runs idemgate mcp without `-- COMMAND`, left as it is");
    return false;
  }
  Span original_span = SpanOf(at, (*args)[original].source());
  splices.push_back({command_span.begin, command_span.end,
                     std::string(text.substr(original_span.begin,
                                             original_span.end - original_span.begin))});
  Span args_span = SpanOf(at, args->source());
  const toml::key* args_key = KeyOf(*table, "args");
  size_t line = at.LineStart(at.Offset(args_key->source().begin));
  size_t line_end = at.NextLine(args_span.end);
  std::string_view args_line = text.substr(line, line_end - line);
  while (!args_line.empty() && (args_line.back() == '\n' || args_line.back() == '\r')) {
    args_line.remove_suffix(1);
  }
  if (original + 1 == args->size() && args_line.ends_with(kAddedMarker)) {
    splices.push_back({line, line_end, ""});  // the line install added
    return true;
  }
  size_t first = SpanOf(at, (*args)[0].source()).begin;
  size_t end = original + 1 < args->size() ? SpanOf(at, (*args)[original + 1].source()).begin
                                           : original_span.end;
  splices.push_back({first, end, ""});
  return true;
}

}  // namespace

Result<EditOutcome> EditTomlServers(std::string_view text, const ServerEdit& edit,
                                    std::string_view source) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    return MakeError(ErrorCode::kInvalidArgument,
                     Where(source, e.source()) + ": not valid TOML (" +
                         std::string(e.description()) + "); fix the file and run again");
  }
  EditOutcome outcome{std::string(text), false, {}};
  const toml::node* servers_node = root.get("mcp_servers");
  const toml::table* servers = servers_node ? servers_node->as_table() : nullptr;
  if (servers_node != nullptr && servers == nullptr) {
    return MakeError(ErrorCode::kInvalidArgument,
                     Where(source, servers_node->source()) +
                         ": `mcp_servers` is not a table; fix the file and run again");
  }
  // In the order they are written (toml++ keeps a table's keys sorted).
  std::vector<const toml::key*> keys;
  if (servers != nullptr) {
    for (const auto& [key, value] : *servers) keys.push_back(&key);
  }
  std::sort(keys.begin(), keys.end(), [](const toml::key* a, const toml::key* b) {
    const auto& pa = a->source().begin;
    const auto& pb = b->source().begin;
    return pa.line != pb.line ? pa.line < pb.line : pa.column < pb.column;
  });
  std::vector<std::string> known;
  for (const toml::key* key : keys) known.emplace_back(key->str());
  for (const std::string& name : edit.servers) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      return MakeError(ErrorCode::kInvalidArgument, UnknownServerMessage(name, source, known));
    }
  }

  Positions at(text);
  std::vector<Splice> splices;
  for (const std::string& name : known) {
    bool selected = edit.servers.empty() ||
                    std::find(edit.servers.begin(), edit.servers.end(), name) != edit.servers.end();
    if (!selected) continue;
    Result<bool> planned =
        PlanServer(text, at, name, *servers->get(name), edit, source, splices, outcome.notes);
    if (!planned) return std::unexpected(planned.error());
  }
  if (splices.empty()) return outcome;
  // From the end backwards, so that earlier offsets stay valid.
  std::sort(splices.begin(), splices.end(),
            [](const Splice& a, const Splice& b) { return a.begin > b.begin; });
  for (const Splice& s : splices) outcome.text.replace(s.begin, s.end - s.begin, s.text);
  outcome.changed = outcome.text != text;
  // What was written must still be TOML (a splice into a layout this code
  // did not foresee would show here, before anything is written).
  try {
    (void)toml::parse(outcome.text, source);
  } catch (const toml::parse_error& e) {
    return MakeError(ErrorCode::kInternal,
                     std::string(source) + ": the edit would not be valid TOML (" +
                         std::string(e.description()) +
                         "); nothing was written; edit the file by hand as docs/hosts.md shows");
  }
  return outcome;
}

}  // namespace idem::cli

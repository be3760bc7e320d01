// The JSON settings of Claude Code and Gemini CLI: servers under the top-level
// `mcpServers`, the prompt hook under `hooks`. The text is parsed into a
// Boost.JSON tree (objects keep their insertion order), edited, and printed
// again with 2-space indentation, as both hosts write their settings
// (JSON.stringify(value, null, 2)), only when something changed.
#include <boost/json.hpp>
#include <charconv>
#include <string>
#include <string_view>
#include <vector>

#include "host_settings.h"
#include "json/json_text.h"

namespace idem::cli {
namespace {

namespace json = boost::json;
using namespace host_settings;

// "line L, column C" (1-based; columns count characters) of byte `offset`.
std::string Where(std::string_view text, size_t offset) {
  size_t line = 1, column = 1;
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) {
      ++column;
    }
  }
  return std::to_string(line) + ":" + std::to_string(column);
}

// Parses with `options`; on failure says where (the byte the parser stopped at).
Result<json::value> ParseAt(std::string_view text, const json::parse_options& options,
                            std::string_view source) {
  json::parser parser(json::storage_ptr(), options);
  boost::system::error_code ec;
  // write() wants one whole text: extra data and an incomplete text are errors.
  size_t used = parser.write(text.data(), text.size(), ec);
  if (ec) {
    return MakeError(ErrorCode::kInvalidArgument,
                     std::string(source) + ":" + Where(text, used) +
                         ": not valid JSON (" + ec.message() + "); fix the file and run again");
  }
  return parser.release();
}

// The settings object of `text`. Comments are refused rather than dropped: the
// hosts accept them (Gemini CLI strips them), but printing the tree again would
// lose them, so the user edits such a file by hand.
Result<json::object> ParseSettings(std::string_view text, std::string_view source) {
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) return json::object();
  json::parse_options strict;
  strict.max_depth = 256;
  Result<json::value> value = ParseAt(text, strict, source);
  if (!value) {
    json::parse_options lenient = strict;
    lenient.allow_comments = true;
    lenient.allow_trailing_commas = true;
    if (ParseAt(text, lenient, source)) {
      return MakeError(
          ErrorCode::kInvalidArgument,
          std::string(source) +
              " has comments or trailing commas, which rewriting it would lose; add idemgate "
              "by hand as docs/hosts.md shows, or remove them and run again");
    }
    return std::unexpected(value.error());
  }
  if (!value->is_object()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     std::string(source) + " is not a JSON object; fix the file and run again");
  }
  return std::move(value->as_object());
}

void AppendNumber(std::string& out, double d) {
  char buffer[32];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, d);
  out.append(buffer, ec == std::errc() ? end : buffer);
}

void Print(std::string& out, const json::value& v, size_t depth) {
  auto newline = [&](size_t d) {
    out += '\n';
    out.append(2 * d, ' ');
  };
  switch (v.kind()) {
    case json::kind::null:
      out += "null";
      return;
    case json::kind::bool_:
      out += v.get_bool() ? "true" : "false";
      return;
    case json::kind::int64:
      out += std::to_string(v.get_int64());
      return;
    case json::kind::uint64:
      out += std::to_string(v.get_uint64());
      return;
    case json::kind::double_:
      AppendNumber(out, v.get_double());
      return;
    case json::kind::string:
      json_text::AppendQuoted(out, v.get_string());
      return;
    case json::kind::array: {
      const json::array& a = v.get_array();
      if (a.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < a.size(); ++i) {
        if (i > 0) out += ',';
        newline(depth + 1);
        Print(out, a[i], depth + 1);
      }
      newline(depth);
      out += ']';
      return;
    }
    case json::kind::object: {
      const json::object& o = v.get_object();
      if (o.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      bool first = true;
      for (const auto& member : o) {
        if (!first) out += ',';
        first = false;
        newline(depth + 1);
        json_text::AppendQuoted(out, member.key());
        out += ": ";
        Print(out, member.value(), depth + 1);
      }
      newline(depth);
      out += '}';
      return;
    }
  }
}

// The edited settings, ending with a newline when the original did (or was empty).
std::string PrintSettings(const json::object& root, std::string_view original) {
  std::string out;
  Print(out, root, 0);
  bool empty = original.find_first_not_of(" \t\r\n") == std::string_view::npos;
  if (empty || original.back() == '\n') out += '\n';
  return out;
}

// The strings of an array, or nullopt if it holds anything else.
std::optional<std::vector<std::string>> Strings(const json::value* v) {
  std::vector<std::string> out;
  if (v == nullptr) return out;
  if (!v->is_array()) return std::nullopt;
  for (const json::value& e : v->get_array()) {
    if (!e.is_string()) return std::nullopt;
    out.emplace_back(e.get_string());
  }
  return out;
}

json::array ToArray(const std::vector<std::string>& strings) {
  json::array a;
  for (const std::string& s : strings) a.emplace_back(s);
  return a;
}

// Wraps or unwraps one server entry; true if it changed.
bool EditServer(const std::string& name, json::value& value, const ServerEdit& edit,
                std::string_view source, std::vector<std::string>& notes) {
  if (!value.is_object()) {
    notes.push_back(std::string(source) + ": server \"" + name +
                    "\" is not a JSON object, left as it is");
    return false;
  }
  json::object& entry = value.get_object();
  const json::value* command = entry.if_contains("command");
  if (command == nullptr) {
    if (entry.contains("url") || entry.contains("httpUrl")) {
      if (edit.action == InstallAction::kInstall) notes.push_back(HttpServerNote(name, source));
    } else {
      notes.push_back(std::string(source) + ": server \"" + name +
                      "\" has no command, left as it is");
    }
    return false;
  }
  std::optional<std::vector<std::string>> args = Strings(entry.if_contains("args"));
  if (!command->is_string() || !args) {
    notes.push_back(std::string(source) + ": server \"" + name +
                    "\" has a command that is not a string or args that are not strings, left "
                    "as it is");
    return false;
  }
  std::string old_command(command->get_string());
  bool wrapped = IsWrapped(old_command, *args);
  if (edit.action == InstallAction::kInstall) {
    if (wrapped) return false;
    entry["command"] = edit.idemgate;
    entry["args"] = ToArray(WrappedArgs(edit, old_command, *args));
    return true;
  }
  if (!wrapped) return false;
  size_t original = OriginalCommandIndex(*args);
  if (original == std::string::npos) {
    notes.push_back(std::string(source) + ": server \"" + name +
                    "\" runs idemgate mcp without `-- COMMAND`, left as it is");
    return false;
  }
  entry["command"] = (*args)[original];
  entry["args"] = ToArray({args->begin() + original + 1, args->end()});
  return true;
}

// The object member `name` of `parent`, created empty if absent.
Result<json::object*> ObjectMember(json::object& parent, std::string_view name, bool create,
                                   std::string_view where) {
  json::value* v = parent.if_contains(name);
  if (v == nullptr) {
    if (!create) return nullptr;
    v = &parent.emplace(name, json::object()).first->value();
  }
  if (!v->is_object()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     std::string(where) + ": `" + std::string(name) +
                         "` is not a JSON object; fix the file and run again");
  }
  return &v->get_object();
}

}  // namespace

Result<EditOutcome> EditJsonServers(std::string_view text, const ServerEdit& edit,
                                    std::string_view source) {
  Result<json::object> root = ParseSettings(text, source);
  if (!root) return std::unexpected(root.error());
  EditOutcome outcome{std::string(text), false, {}};
  Result<json::object*> servers = ObjectMember(*root, "mcpServers", false, source);
  if (!servers) return std::unexpected(servers.error());
  std::vector<std::string> known;
  if (*servers != nullptr) {
    for (const auto& member : **servers) known.emplace_back(member.key());
  }
  for (const std::string& name : edit.servers) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      return MakeError(ErrorCode::kInvalidArgument, UnknownServerMessage(name, source, known));
    }
  }
  if (*servers == nullptr) return outcome;
  for (auto& member : **servers) {
    std::string name(member.key());
    bool selected = edit.servers.empty() ||
                    std::find(edit.servers.begin(), edit.servers.end(), name) != edit.servers.end();
    if (selected && EditServer(name, member.value(), edit, source, outcome.notes)) {
      outcome.changed = true;
    }
  }
  if (outcome.changed) outcome.text = PrintSettings(*root, text);
  return outcome;
}

Result<EditOutcome> EditJsonHook(std::string_view text, const HookEdit& edit,
                                 std::string_view source) {
  Result<json::object> root = ParseSettings(text, source);
  if (!root) return std::unexpected(root.error());
  EditOutcome outcome{std::string(text), false, {}};
  const bool install = edit.action == InstallAction::kInstall;
  const char* event = edit.host == HookHost::kClaudeCode ? "UserPromptSubmit" : "BeforeAgent";

  Result<json::object*> hooks = ObjectMember(*root, "hooks", install, source);
  if (!hooks) return std::unexpected(hooks.error());
  if (*hooks == nullptr) return outcome;  // uninstall, nothing there
  json::value* groups = (*hooks)->if_contains(event);
  if (groups == nullptr) {
    if (!install) return outcome;
    groups = &(*hooks)->emplace(event, json::array()).first->value();
  }
  if (!groups->is_array()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     std::string(source) + ": `hooks." + event +
                         "` is not a JSON array; fix the file and run again");
  }
  json::array& list = groups->get_array();

  // idemgate's entries, wherever they are among the groups.
  bool found = false;
  for (auto group = list.begin(); group != list.end();) {
    json::array* entries = nullptr;
    if (group->is_object()) {
      if (json::value* h = group->get_object().if_contains("hooks"); h && h->is_array()) {
        entries = &h->get_array();
      }
    }
    if (entries == nullptr) {
      ++group;
      continue;
    }
    bool emptied = false;
    for (auto entry = entries->begin(); entry != entries->end();) {
      const json::value* command =
          entry->is_object() ? entry->get_object().if_contains("command") : nullptr;
      if (command == nullptr || !command->is_string() ||
          !IsIdemgateHookCommand(command->get_string())) {
        ++entry;
        continue;
      }
      found = true;
      if (install) {
        if (command->get_string() != edit.command) {
          entry->get_object()["command"] = edit.command;
          outcome.changed = true;
        }
        ++entry;
      } else {
        entry = entries->erase(entry);
        outcome.changed = true;
        emptied = entries->empty();
      }
    }
    group = emptied ? list.erase(group) : group + 1;
  }

  if (install && !found) {
    json::object hook;
    if (edit.host == HookHost::kGeminiCli) hook["name"] = "idemgate";
    hook["type"] = "command";
    hook["command"] = edit.command;
    json::object group;
    if (edit.host == HookHost::kGeminiCli) group["matcher"] = "*";
    group["hooks"] = json::array{std::move(hook)};
    list.emplace_back(std::move(group));
    outcome.changed = true;
  }
  if (!install && outcome.changed) {
    // Containers emptied by the removal go too, so that uninstalling
    // restores a file that had no hooks before.
    if (list.empty()) (*hooks)->erase(event);
    if ((*hooks)->empty()) root->erase("hooks");
  }
  if (install && edit.host == HookHost::kGeminiCli) {
    const json::value* config = root->if_contains("hooksConfig");
    const json::value* enabled =
        config && config->is_object() ? config->get_object().if_contains("enabled") : nullptr;
    if (enabled && enabled->is_bool() && !enabled->get_bool()) {
      outcome.notes.push_back(std::string(source) +
                              ": hooksConfig.enabled is false, so Gemini CLI runs no hook; set "
                              "it to true for idemgate's turn ids");
    }
  }
  if (outcome.changed) outcome.text = PrintSettings(*root, text);
  return outcome;
}

}  // namespace idem::cli

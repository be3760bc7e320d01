// The flags every HTTP front (`serve`, `http`) gives its listener, and how
// they combine with the config into http::ListenerOptions: a flag wins over
// the config ([listen] address, [limits] max_body_bytes), which wins over
// the built-in default; [[tenant]] tokens turn authentication on.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "net/http_listener.h"
#include "idem/clock.h"
#include "idem/config.h"
#include "idem/error.h"

namespace CLI {
class App;
}

namespace idem::cli {

struct ListenerFlags {
  std::string listen;  // --listen; empty: [listen] address, else the command's default
  bool insecure_no_auth = false;
  std::string max_body;  // --max-body-bytes; empty: [limits] max_body_bytes
  size_t max_header_bytes = 16 * 1024;
  size_t max_header_count = 100;
  size_t max_connections = 1024;
  std::string read_timeout = "30s";
  std::string write_timeout = "30s";
  std::string drain_timeout = "15s";  // on SIGINT/SIGTERM
  int threads = 2;
};

// Adds --listen, --insecure-no-auth, --max-body-bytes, --max-header-bytes,
// --max-header-count, --max-connections, --read-timeout, --write-timeout,
// --drain-timeout and --threads to `cmd`. `flags` must outlive parsing.
void AddListenerFlags(CLI::App* cmd, ListenerFlags& flags, std::string_view default_listen);

struct ListenerSetup {
  http::ListenerOptions options;
  Duration drain_timeout{15'000};
};

// The duration `text` of flag `flag` ("--read-timeout"), which must be
// longer than zero; kInvalidArgument naming the flag otherwise.
Result<Duration> ParsePositiveDuration(std::string_view flag, const std::string& text);

// The listener's options from the flags and `config`, named `name` in its log
// lines. With --max-body-bytes, config.limits.max_body_bytes is set to it too
// (the fronts read their limits from the config). options.authenticate reads
// `config`, which must outlive the listener. kInvalidArgument (a usage error)
// for a bad value, naming the flag.
Result<ListenerSetup> ListenerSetupFor(const ListenerFlags& flags, Config& config, std::string name,
                                       std::string_view default_listen);

}  // namespace idem::cli

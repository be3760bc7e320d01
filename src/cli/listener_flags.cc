#include "listener_flags.h"

#include <CLI/CLI.hpp>

namespace idem::cli {

Result<Duration> ParsePositiveDuration(std::string_view flag, const std::string& text) {
  Result<Duration> d = ParseDuration(text);
  if (!d)
    return MakeError(ErrorCode::kInvalidArgument, std::string(flag) + ": " + d.error().message);
  if (d->count() <= 0) {
    return MakeError(ErrorCode::kInvalidArgument, std::string(flag) + ": must be longer than zero");
  }
  return d;
}

void AddListenerFlags(CLI::App* cmd, ListenerFlags& flags, std::string_view default_listen) {
  cmd->add_option("--listen", flags.listen,
                  "Address to serve; default: the config's [listen] address, else " +
                      std::string(default_listen))
      ->option_text("HOST:PORT");
  cmd->add_flag("--insecure-no-auth", flags.insecure_no_auth,
                "Allow a non-loopback address without [[tenant]] tokens configured");
  cmd->add_option("--max-body-bytes", flags.max_body,
                  "Largest request body (e.g. 1MiB); default: the config's [limits] "
                  "max_body_bytes (1 MiB)")
      ->option_text("SIZE");
  cmd->add_option("--max-header-bytes", flags.max_header_bytes, "Largest request header block")
      ->capture_default_str();
  cmd->add_option("--max-header-count", flags.max_header_count, "Most header fields per request")
      ->capture_default_str();
  cmd->add_option("--max-connections", flags.max_connections,
                  "Concurrent connections; more get 503")
      ->capture_default_str();
  cmd->add_option("--read-timeout", flags.read_timeout,
                  "A whole request must arrive within this (idle keep-alive included)")
      ->capture_default_str();
  cmd->add_option("--write-timeout", flags.write_timeout,
                  "Writing one answer must finish within this")
      ->capture_default_str();
  cmd->add_option("--drain-timeout", flags.drain_timeout,
                  "On SIGINT/SIGTERM, how long requests in flight may take to finish")
      ->capture_default_str();
  cmd->add_option("--threads", flags.threads, "I/O threads")->capture_default_str();
}

Result<ListenerSetup> ListenerSetupFor(const ListenerFlags& flags, Config& config, std::string name,
                                       std::string_view default_listen) {
  if (flags.threads < 1 || flags.max_connections < 1 || flags.max_header_count < 1 ||
      flags.max_header_bytes < 1024) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "--threads, --max-connections and --max-header-count must be at least 1, "
                     "--max-header-bytes at least 1024");
  }
  ListenerSetup setup;
  http::ListenerOptions& o = setup.options;
  o.name = std::move(name);
  o.insecure_no_auth = flags.insecure_no_auth;
  o.max_header_bytes = flags.max_header_bytes;
  o.max_header_count = flags.max_header_count;
  o.max_connections = flags.max_connections;
  o.threads = flags.threads;
  for (auto [flag, text, out] :
       {std::tuple{"--read-timeout", &flags.read_timeout, &o.read_timeout},
        std::tuple{"--write-timeout", &flags.write_timeout, &o.write_timeout},
        std::tuple{"--drain-timeout", &flags.drain_timeout, &setup.drain_timeout}}) {
    Result<Duration> d = ParsePositiveDuration(flag, *text);
    if (!d) return std::unexpected(d.error());
    *out = *d;
  }
  if (!flags.max_body.empty()) {
    Result<size_t> size = ParseSize(flags.max_body);
    if (!size || *size == 0) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "--max-body-bytes: " +
                           (size ? std::string("must be more than zero") : size.error().message));
    }
    config.limits.max_body_bytes = *size;
  }
  o.max_body_bytes = config.limits.max_body_bytes;
  o.listen = !flags.listen.empty()            ? flags.listen
             : !config.listen.address.empty() ? config.listen.address
                                              : std::string(default_listen);
  if (!config.tenants.empty()) {
    o.authenticate = [&config](std::string_view token) -> std::optional<http::Principal> {
      const Tenant* tenant = config.TenantForToken(token);
      if (tenant == nullptr) return std::nullopt;
      return http::Principal{tenant->name, tenant->admin};
    };
  }
  return setup;
}

}  // namespace idem::cli

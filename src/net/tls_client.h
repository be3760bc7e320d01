// TLS for idemgate's clients, set up one way for all of them: HTTP upstreams
// (MCP and the reverse proxy), the alert webhook and the Redis store. A
// context per client, from its options; then, per connection, SNI and the
// name the server's certificate must carry.
#pragma once

#include <openssl/ssl.h>

#include <memory>
#include <string>
#include <string_view>

#include "idem/error.h"

namespace idem::net {

struct TlsClientOptions {
  // Verify the server's certificate chain and name. false: no verification
  // at all (testing only).
  bool verify = true;
  // PEM CA certificates trusted besides the system trust store.
  std::string ca_file;
  // A PEM client certificate and its key, for servers that ask for one.
  std::string cert_file;
  std::string key_file;
  // What the user calls these files, for messages ("upstream_ca_file",
  // "tls_ca", …).
  std::string ca_option = "ca_file";
  std::string cert_option = "cert_file";
  std::string key_option = "key_file";
};

struct SslCtxFree {
  void operator()(SSL_CTX* ctx) const { SSL_CTX_free(ctx); }
};
using SslCtxPtr = std::unique_ptr<SSL_CTX, SslCtxFree>;

// A client context (TLS 1.2 or later) with the trust store and client
// certificate loaded. kInvalidArgument naming the option and file that cannot
// be loaded, with OpenSSL's reason.
Result<SslCtxPtr> NewTlsClientContext(const TlsClientOptions& options);

// For one connection, before its handshake: SNI when `host` is a name (not an
// IP literal) and, when `verify`, the name or address the certificate must
// carry.
void PrepareTlsClient(SSL* ssl, const std::string& host, bool verify);

// OpenSSL's queued errors as one line of reasons ("certificate verify
// failed; …"), emptying the queue; `fallback` when it is empty.
std::string TlsErrors(std::string_view fallback);

}  // namespace idem::net

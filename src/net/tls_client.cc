#include "net/tls_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>

namespace idem::net {
namespace {

bool IsIpLiteral(const std::string& host) {
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

}  // namespace

std::string TlsErrors(std::string_view fallback) {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    // "error:0A000086:SSL routines::certificate verify failed": the reason.
    std::string_view text(buf);
    if (size_t colon = text.rfind(':'); colon != std::string_view::npos) {
      text = text.substr(colon + 1);
    }
    if (!out.empty()) out += "; ";
    out += text;
  }
  return out.empty() ? std::string(fallback) : out;
}

Result<SslCtxPtr> NewTlsClientContext(const TlsClientOptions& options) {
  ERR_clear_error();
  SslCtxPtr ctx(SSL_CTX_new(TLS_client_method()));
  if (!ctx) {
    return MakeError(ErrorCode::kInternal,
                     "cannot create a TLS context: " + TlsErrors("out of memory"));
  }
  auto refuse = [](const std::string& option, const std::string& file) {
    return MakeError(ErrorCode::kInvalidArgument, "cannot load " + option + " '" + file +
                                                      "': " + TlsErrors("unreadable") +
                                                      " (expected a readable PEM file)");
  };
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  if (options.verify) {
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
    if (SSL_CTX_set_default_verify_paths(ctx.get()) != 1) {
      return MakeError(ErrorCode::kUnavailable,
                       "cannot load the system TLS trust store: " + TlsErrors("unreadable"));
    }
    if (!options.ca_file.empty() &&
        SSL_CTX_load_verify_locations(ctx.get(), options.ca_file.c_str(), nullptr) != 1) {
      return refuse(options.ca_option, options.ca_file);
    }
  } else {
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_NONE, nullptr);
  }
  if (!options.cert_file.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx.get(), options.cert_file.c_str()) != 1) {
      return refuse(options.cert_option, options.cert_file);
    }
    if (SSL_CTX_use_PrivateKey_file(ctx.get(), options.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
      return refuse(options.key_option, options.key_file);
    }
    if (SSL_CTX_check_private_key(ctx.get()) != 1) {
      return MakeError(ErrorCode::kInvalidArgument,
                       options.key_option + " '" + options.key_file + "' is not the key of " +
                           options.cert_option + " '" + options.cert_file + "'");
    }
  }
  return ctx;
}

void PrepareTlsClient(SSL* ssl, const std::string& host, bool verify) {
  const bool ip = IsIpLiteral(host);
  if (!ip) SSL_set_tlsext_host_name(ssl, host.c_str());
  if (!verify) return;
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  if (ip) {
    X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str());
  } else {
    X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    X509_VERIFY_PARAM_set1_host(param, host.c_str(), host.size());
  }
}

}  // namespace idem::net

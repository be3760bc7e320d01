// OpenStore: the one place that knows every backend. Fronts and the CLI reach
// stores only through it.
#include <cstdlib>
#include <string>

#include "idem/store.h"
#include "memory_store.h"
#include "net/url_text.h"
#include "postgres_store.h"
#include "redis_store.h"
#include "redis_url.h"
#include "sqlite_store.h"

namespace idem {

std::string DefaultStoreUrl() {
  if (const char* state = std::getenv("XDG_STATE_HOME"); state && *state) {
    return "sqlite:" + std::string(state) + "/idemgate/idemgate.db";
  }
  if (const char* home = std::getenv("HOME"); home && *home) {
    return "sqlite:" + std::string(home) + "/.local/state/idemgate/idemgate.db";
  }
  return "sqlite:idemgate.db";
}

Result<std::unique_ptr<Store>> OpenStore(std::string_view url, Clock& clock,
                                         const StoreOptions& options) {
  if (url == "memory:" || url == "memory") return NewMemoryStore(clock);
  if (url.starts_with("sqlite:")) {
    std::string path(url.substr(7));
    if (path.starts_with("//")) path.erase(0, 2);  // sqlite:///abs/path and sqlite://rel
    if (path.empty()) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "store URL \"sqlite:\" has no path; write sqlite:PATH, e.g. "
                       "sqlite:/var/lib/idemgate/idemgate.db");
    }
    return OpenSqliteStore(path, clock, options);
  }
  if (redis::IsRedisUrl(url)) return OpenRedisStore(url, clock, options);
  if (url.starts_with("postgres://") || url.starts_with("postgresql://")) {
    return OpenPostgresStore(url, clock, options);
  }
  return MakeError(ErrorCode::kInvalidArgument,
                   "unsupported store URL \"" + net::WithoutPassword(url) +
                       "\"; supported: memory:, sqlite:PATH, redis://HOST[:PORT][/DB], "
                       "redis+cluster://HOST:PORT,HOST:PORT,… (rediss:// and "
                       "rediss+cluster:// for TLS), "
                       "postgres://USER@HOST[:PORT]/DBNAME[?schema=NAME]");
}

}  // namespace idem

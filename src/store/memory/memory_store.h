// The memory store: a complete, non-durable backend for tests and
// single-process use. Passes the store contract suite like every backend.
#pragma once

#include <memory>

#include "idem/store.h"

namespace idem {

// `clock` must outlive the store. Thread-safe.
std::unique_ptr<Store> NewMemoryStore(Clock& clock);

}  // namespace idem

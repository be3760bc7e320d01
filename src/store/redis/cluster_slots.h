// Redis Cluster key → slot → node. No I/O: CLUSTER SLOTS replies in, a map
// out.
#pragma once

#include <hiredis/hiredis.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "idem/error.h"
#include "redis_url.h"

namespace idem::redis {

inline constexpr int kSlotCount = 16384;

// The cluster slot of `key`: CRC16 (XMODEM) of its hash tag — the bytes
// between the first '{' and the next '}' if that is non-empty — else of the
// whole key, modulo 16384.
int KeySlot(std::string_view key);

// Which master serves each slot. A value; copy it freely.
class SlotMap {
 public:
  SlotMap() { owner_.fill(-1); }
  // Parses a CLUSTER SLOTS reply. `asked` is the node that answered: an
  // empty host in the reply means that node's host. kDataLoss if the reply
  // is not the documented shape.
  static Result<SlotMap> Parse(const redisReply* reply, const NodeAddress& asked);

  // The master of `slot`, or nullopt if no node serves it (the cluster is
  // incomplete).
  std::optional<NodeAddress> NodeFor(int slot) const;
  // Points `slot` at `node` (after a MOVED redirection).
  void Assign(int slot, const NodeAddress& node);
  // Every master, each once.
  const std::vector<NodeAddress>& masters() const { return masters_; }

 private:
  std::vector<NodeAddress> masters_;
  std::array<int16_t, kSlotCount> owner_;  // index into masters_, -1 for none
};

}  // namespace idem::redis

#include "cluster_slots.h"

#include <algorithm>
#include <string>

namespace idem::redis {
namespace {

uint16_t Crc16(std::string_view data) {
  // CRC-16/XMODEM (poly 0x1021, init 0), as in the Redis Cluster spec.
  uint16_t crc = 0;
  for (unsigned char byte : data) {
    crc ^= static_cast<uint16_t>(byte) << 8;
    for (int i = 0; i < 8; ++i) {
      crc = (crc & 0x8000) ? static_cast<uint16_t>((crc << 1) ^ 0x1021)
                           : static_cast<uint16_t>(crc << 1);
    }
  }
  return crc;
}

Error Malformed(const NodeAddress& asked, std::string_view what) {
  return Error{ErrorCode::kDataLoss, "redis " + asked.ToString() +
                                         ": unexpected CLUSTER SLOTS reply (" + std::string(what) +
                                         "); is this a Redis Cluster node?"};
}

}  // namespace

int KeySlot(std::string_view key) {
  if (size_t open = key.find('{'); open != std::string_view::npos) {
    size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return Crc16(key) & (kSlotCount - 1);
}

Result<SlotMap> SlotMap::Parse(const redisReply* reply, const NodeAddress& asked) {
  if (reply == nullptr || reply->type != REDIS_REPLY_ARRAY) {
    return std::unexpected(Malformed(asked, "not an array"));
  }
  SlotMap map;
  for (size_t i = 0; i < reply->elements; ++i) {
    const redisReply* range = reply->element[i];
    if (range->type != REDIS_REPLY_ARRAY || range->elements < 3 ||
        range->element[0]->type != REDIS_REPLY_INTEGER ||
        range->element[1]->type != REDIS_REPLY_INTEGER ||
        range->element[2]->type != REDIS_REPLY_ARRAY || range->element[2]->elements < 2) {
      return std::unexpected(Malformed(asked, "bad slot range"));
    }
    const long long first = range->element[0]->integer, last = range->element[1]->integer;
    const redisReply* master = range->element[2];
    if (first < 0 || last >= kSlotCount || first > last ||
        master->element[0]->type != REDIS_REPLY_STRING ||
        master->element[1]->type != REDIS_REPLY_INTEGER) {
      return std::unexpected(Malformed(asked, "bad master entry"));
    }
    NodeAddress node{std::string(master->element[0]->str, master->element[0]->len),
                     static_cast<int>(master->element[1]->integer)};
    // "" (or "?") means: the endpoint you asked.
    if (node.host.empty() || node.host == "?") node.host = asked.host;
    auto it = std::find(map.masters_.begin(), map.masters_.end(), node);
    if (it == map.masters_.end()) {
      map.masters_.push_back(node);
      it = map.masters_.end() - 1;
    }
    const auto index = static_cast<int16_t>(it - map.masters_.begin());
    for (long long s = first; s <= last; ++s) map.owner_[s] = index;
  }
  return map;
}

std::optional<NodeAddress> SlotMap::NodeFor(int slot) const {
  if (slot < 0 || slot >= kSlotCount || owner_[slot] < 0) return std::nullopt;
  return masters_[owner_[slot]];
}

void SlotMap::Assign(int slot, const NodeAddress& node) {
  if (slot < 0 || slot >= kSlotCount) return;
  auto it = std::find(masters_.begin(), masters_.end(), node);
  if (it == masters_.end()) {
    masters_.push_back(node);
    it = masters_.end() - 1;
  }
  owner_[slot] = static_cast<int16_t>(it - masters_.begin());
}

}  // namespace idem::redis

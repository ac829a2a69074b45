// Redis Cluster hash slots: CRC16 (XMODEM) of the key, or of its hash tag, modulo 16384.
//
//   std::uint32_t s = redcount::key_slot("{user1000}.following");   // 3443
//
// The hash tag is the text between the first '{' and the first '}' after it, when that
// text is not empty; every key of one script call or transaction shares a tag so that
// it lands on one slot (one node).
#pragma once

#include <cstdint>
#include <string_view>

namespace redcount {

inline constexpr std::uint32_t kClusterSlots = 16384;

// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), as Redis Cluster uses it.
std::uint16_t crc16(std::string_view data) noexcept;

// The part of `key` that is hashed: its non-empty hash tag, or the whole key.
std::string_view hash_tag(std::string_view key) noexcept;

// The key's slot, 0..16383.
std::uint32_t key_slot(std::string_view key) noexcept;

}  // namespace redcount

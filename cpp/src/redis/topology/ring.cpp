#include "redcount/redis/topology/ring.h"

#include <limits>

#include "redcount/common/errors.h"
#include "redcount/common/util.h"

namespace redcount::redis {

std::uint64_t fnv1a64(std::string_view bytes) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

namespace {

std::uint64_t weight(std::uint64_t name_hash, std::uint32_t slot) noexcept {
  std::uint64_t z = name_hash + 0x9e3779b97f4a7c15ULL * (static_cast<std::uint64_t>(slot) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

std::uint64_t ring_weight(std::string_view name, std::uint32_t slot) noexcept { return weight(fnv1a64(name), slot); }

Ring::Ring(std::vector<std::string> names) : names_(std::move(names)) {
  if (names_.empty()) throw InvalidArgument("a ring needs at least one node name");
  if (names_.size() > std::numeric_limits<std::uint16_t>::max()) {
    throw InvalidArgument("a ring holds at most 65535 nodes");
  }
  std::vector<std::uint64_t> name_hash;
  name_hash.reserve(names_.size());
  for (std::size_t i = 0; i < names_.size(); ++i) {
    if (names_[i].empty()) throw InvalidArgument("ring node #" + std::to_string(i + 1) + " has an empty name");
    for (std::size_t j = 0; j < i; ++j) {
      if (names_[j] == names_[i]) {
        throw InvalidArgument("ring node name '" + printable(names_[i]) + "' is given twice: names must be unique");
      }
    }
    name_hash.push_back(fnv1a64(names_[i]));
  }
  table_.resize(kRingSlots);
  for (std::uint32_t slot = 0; slot < kRingSlots; ++slot) {
    std::size_t best = 0;
    std::uint64_t best_weight = weight(name_hash[0], slot);
    for (std::size_t i = 1; i < names_.size(); ++i) {
      const std::uint64_t w = weight(name_hash[i], slot);
      // Ties (1 in 2^64 per pair) go to the smaller name, so the order of the list never matters.
      if (w > best_weight || (w == best_weight && names_[i] < names_[best])) {
        best = i;
        best_weight = w;
      }
    }
    table_[slot] = static_cast<std::uint16_t>(best);
  }
}

std::vector<std::size_t> Ring::slot_counts() const {
  std::vector<std::size_t> counts(names_.size(), 0);
  for (auto n : table_) ++counts[n];
  return counts;
}

}  // namespace redcount::redis

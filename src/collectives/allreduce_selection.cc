#include <charconv>
#include <string>

#include "relaxcc/collectives/allreduce.h"
#include "relaxcc/errors.h"

namespace relaxcc {

std::string_view allreduce_algo_name(AllreduceAlgo algo) noexcept {
  switch (algo) {
    case AllreduceAlgo::automatic:
      return "auto";
    case AllreduceAlgo::ring:
      return "ring";
    case AllreduceAlgo::recursive_doubling:
      return "recursive_doubling";
  }
  return "invalid";
}

AllreduceAlgo parse_allreduce_algo(std::string_view name) {
  for (AllreduceAlgo a :
       {AllreduceAlgo::automatic, AllreduceAlgo::ring, AllreduceAlgo::recursive_doubling})
    if (allreduce_algo_name(a) == name) return a;
  RELAXCC_THROW(InvalidArgument, "unknown allreduce algorithm '", name,
                "': expected auto, ring or recursive_doubling");
}

namespace {
int64_t parse_bound(std::string_view text, std::string_view whole) {
  int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  RELAXCC_ENFORCE(ec == std::errc() && ptr == text.data() + text.size() && v >= 0, InvalidArgument,
                  "allreduce selection '", whole, "': bad byte bound '", text, "'");
  return v;
}
}  // namespace

AllreduceSelection AllreduceSelection::parse(std::string_view text) {
  AllreduceSelection sel;
  if (text.find(':') == std::string_view::npos) {
    const AllreduceAlgo a = parse_allreduce_algo(text);
    RELAXCC_ENFORCE(a != AllreduceAlgo::automatic, InvalidArgument,
                    "allreduce selection: 'auto' cannot be forced");
    sel.ranges_.push_back(Range{0, INT64_MAX, a});
    return sel;
  }
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(';', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view item = text.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    const size_t colon = item.find(':');
    const size_t dash = item.find('-', colon);
    RELAXCC_ENFORCE(colon != std::string_view::npos && dash != std::string_view::npos,
                    InvalidArgument, "allreduce selection '", text,
                    "': expected 'algo:lo-hi', got '", item, "'");
    Range r;
    r.algo = parse_allreduce_algo(item.substr(0, colon));
    RELAXCC_ENFORCE(r.algo != AllreduceAlgo::automatic, InvalidArgument, "allreduce selection '",
                    text, "': 'auto' is not an algorithm");
    r.lo = parse_bound(item.substr(colon + 1, dash - colon - 1), text);
    const std::string_view hi = item.substr(dash + 1);
    r.hi = hi.empty() ? INT64_MAX : parse_bound(hi, text);
    RELAXCC_ENFORCE_LE(r.lo, r.hi, InvalidArgument, "allreduce selection '", text, "'");
    sel.ranges_.push_back(r);
  }
  RELAXCC_ENFORCE(!sel.ranges_.empty(), InvalidArgument, "allreduce selection '", text,
                  "' is empty");
  return sel;
}

AllreduceAlgo AllreduceSelection::pick(int64_t bytes) const noexcept {
  for (const Range& r : ranges_)
    if (bytes >= r.lo && bytes <= r.hi) return r.algo;
  return AllreduceAlgo::ring;
}

}  // namespace relaxcc

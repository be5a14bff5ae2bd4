#include "src/engine/tunables_check.h"

#include "relaxcc/collectives/allreduce.h"
#include "relaxcc/errors.h"

namespace relaxcc::engine {

void check_tunables(const Tunables& t) {
  AllreduceSelection::parse(t.allreduce_algo);
  RELAXCC_ENFORCE(t.engine_poll == "auto" || t.engine_poll == "sleep" || t.engine_poll == "yield",
                  InvalidArgument, "RELAXCC_ENGINE_POLL='", t.engine_poll,
                  "': expected auto, sleep or yield");
  RELAXCC_ENFORCE(
      t.peer_timeout_ms == 0 || (t.peer_timeout_ms >= 200 && t.peer_timeout_ms <= 600000),
      InvalidArgument, "RELAXCC_PEER_TIMEOUT_MS=", t.peer_timeout_ms,
      ": expected 0 (off) or 200 to 600000");
  RELAXCC_ENFORCE(t.timeout_ms > 0, InvalidArgument, "RELAXCC_TIMEOUT_MS=", t.timeout_ms,
                  ": expected a positive number of milliseconds");
  RELAXCC_ENFORCE(t.ranks_per_node >= 0, InvalidArgument,
                  "RELAXCC_RANKS_PER_NODE=", t.ranks_per_node,
                  ": expected 0 (detect) or a positive number");
  RELAXCC_ENFORCE(t.segment_bytes > 0, InvalidArgument, "RELAXCC_SEGMENT_BYTES=", t.segment_bytes,
                  ": expected a positive size");
  RELAXCC_ENFORCE(t.net_segment_bytes > 0, InvalidArgument,
                  "RELAXCC_NET_SEGMENT_BYTES=", t.net_segment_bytes, ": expected a positive size");
  RELAXCC_ENFORCE(t.pipeline_depth >= 0, InvalidArgument,
                  "RELAXCC_PIPELINE_DEPTH=", t.pipeline_depth,
                  ": expected 0 (sized to the path) or a positive number");
  RELAXCC_ENFORCE(t.link_mbit >= 0, InvalidArgument, "RELAXCC_LINK_MBIT=", t.link_mbit,
                  ": expected 0 (no probe) or a positive rate in Mbit/s");
  RELAXCC_ENFORCE(t.window_bytes > 0, InvalidArgument, "RELAXCC_WINDOW_BYTES=", t.window_bytes,
                  ": expected a positive size");
  RELAXCC_ENFORCE(t.round_part_bytes >= 1024, InvalidArgument,
                  "RELAXCC_ROUND_PART_BYTES=", t.round_part_bytes, ": expected at least 1024");
}

}  // namespace relaxcc::engine

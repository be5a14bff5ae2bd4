// The TcpStore wire format. Every message, request or reply, is a 16-byte
// header and a body:
//
//   magic u32 ("RXST")  version u16  code u16  body_bytes u32  check u32
//
// all little-endian; check is the low 32 bits of the FNV-1a hash of version,
// code, body_bytes and the body. The body is a sequence of fields, each a u32
// length and that many bytes; integers travel as 8-byte little-endian fields.
// A request's code is its Op and it carries exactly the fields its Op names;
// a reply's code is a Status. A connection carries one request at a time:
// the client sends the next one after the reply.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace relaxcc::store_wire {

inline constexpr uint32_t kMagic = 0x54535852;  // "RXST" in memory order
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kHeaderBytes = 16;

// Requests, with their fields.
enum class Op : uint16_t {
  set = 1,          // key, value -> ok
  get = 2,          // key, timeout_ms -> ok value | timeout
  add = 3,          // key, delta -> ok new_value | invalid
  compare_set = 4,  // key, expected, desired -> ok value_after
  wait = 5,         // timeout_ms, key... (at least one) -> ok | timeout missing_key...
  check = 6,        // key... -> ok u64 (1 when all are set)
  num_keys = 7,     // -> ok count
  delete_key = 8,   // key -> ok u64 (1 when it was set)
};

// Replies. protocol_error: the request broke the format; its field is the
// reason, and the server closes the connection after sending it.
enum class Status : uint16_t {
  ok = 0x8000,
  timeout = 0x8001,
  invalid = 0x8002,
  protocol_error = 0x8003
};

// The name of a request code ("get"), or nullptr when it is none.
const char* op_name(uint16_t code);
// The number of fields an Op takes: {min, max} (wait and check take a list).
std::pair<size_t, size_t> op_fields(Op op);

struct Header {
  uint16_t code = 0;
  uint32_t body_bytes = 0;
  uint32_t check = 0;
};

// One encoded message: header and body.
std::string encode(uint16_t code, const std::vector<std::string>& fields);
std::string encode_u64(uint64_t v);
// Decodes an 8-byte field; nullopt when it has another length.
std::optional<uint64_t> decode_u64(std::string_view field);

// Decodes the 16 bytes at `data`. On a bad magic, version or a body over
// `max_body_bytes`, returns nullopt and sets `error` to the reason.
std::optional<Header> parse_header(const char* data, size_t max_body_bytes, std::string& error);
// Checks `body` against header.check and splits it into fields. On a
// mismatch or a malformed field list, returns false and sets `error`.
bool parse_body(const Header& header, std::string_view body, std::vector<std::string>& fields,
                std::string& error);

// `key` quoted for messages, with bytes outside printable ASCII escaped.
std::string quote(std::string_view key);

}  // namespace relaxcc::store_wire

#include "src/rendezvous/wire.h"

#include <cstdio>

#include "relaxcc/errors.h"
#include "relaxcc/hash.h"

namespace relaxcc::store_wire {
namespace {

void put_u16(std::string& out, uint16_t v) {
  out.push_back(static_cast<char>(v & 0xff));
  out.push_back(static_cast<char>(v >> 8));
}

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

uint16_t get_u16(const char* p) {
  return static_cast<uint16_t>(static_cast<unsigned char>(p[0]) |
                               (static_cast<unsigned char>(p[1]) << 8));
}

uint32_t checksum(uint16_t version, uint16_t code, uint32_t body_bytes, std::string_view body) {
  Fnv1a h;
  h.u64(version).u64(code).u64(body_bytes).bytes(body);
  return static_cast<uint32_t>(h.value());
}

}  // namespace

const char* op_name(uint16_t code) {
  switch (static_cast<Op>(code)) {
    case Op::set:
      return "set";
    case Op::get:
      return "get";
    case Op::add:
      return "add";
    case Op::compare_set:
      return "compare_set";
    case Op::wait:
      return "wait";
    case Op::check:
      return "check";
    case Op::num_keys:
      return "num_keys";
    case Op::delete_key:
      return "delete_key";
  }
  return nullptr;
}

std::pair<size_t, size_t> op_fields(Op op) {
  switch (op) {
    case Op::set:
      return {2, 2};
    case Op::get:
      return {2, 2};
    case Op::add:
      return {2, 2};
    case Op::compare_set:
      return {3, 3};
    case Op::wait:
      return {2, SIZE_MAX};
    case Op::check:
      return {1, SIZE_MAX};
    case Op::num_keys:
      return {0, 0};
    case Op::delete_key:
      return {1, 1};
  }
  return {0, 0};
}

std::string encode(uint16_t code, const std::vector<std::string>& fields) {
  std::string body;
  size_t total = 0;
  for (const auto& f : fields) total += 4 + f.size();
  RELAXCC_ENFORCE(total <= UINT32_MAX, InvalidArgument, "store message of ", total,
                  " bytes: over the wire format's 4 GiB");
  body.reserve(total);
  for (const auto& f : fields) {
    put_u32(body, static_cast<uint32_t>(f.size()));
    body.append(f);
  }
  std::string out;
  out.reserve(kHeaderBytes + body.size());
  put_u32(out, kMagic);
  put_u16(out, kVersion);
  put_u16(out, code);
  put_u32(out, static_cast<uint32_t>(body.size()));
  put_u32(out, checksum(kVersion, code, static_cast<uint32_t>(body.size()), body));
  out.append(body);
  return out;
}

std::string encode_u64(uint64_t v) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return out;
}

std::optional<uint64_t> decode_u64(std::string_view field) {
  if (field.size() != 8) return std::nullopt;
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(field[i]);
  return v;
}

std::optional<Header> parse_header(const char* data, size_t max_body_bytes, std::string& error) {
  const uint32_t magic = get_u32(data);
  if (magic != kMagic) {
    char text[16];
    std::snprintf(text, sizeof text, "0x%08x", magic);
    error = detail::concat("bad magic ", text, " (not a relaxcc store message)");
    return std::nullopt;
  }
  const uint16_t version = get_u16(data + 4);
  if (version != kVersion) {
    error = detail::concat("protocol version ", version, ", this side speaks version ", kVersion);
    return std::nullopt;
  }
  Header h;
  h.code = get_u16(data + 6);
  h.body_bytes = get_u32(data + 8);
  h.check = get_u32(data + 12);
  if (h.body_bytes > max_body_bytes) {
    error =
        detail::concat("a message of ", h.body_bytes, " bytes, over the limit of ", max_body_bytes);
    return std::nullopt;
  }
  return h;
}

bool parse_body(const Header& header, std::string_view body, std::vector<std::string>& fields,
                std::string& error) {
  if (checksum(kVersion, header.code, header.body_bytes, body) != header.check) {
    error = "checksum mismatch (corrupt message)";
    return false;
  }
  fields.clear();
  size_t at = 0;
  while (at < body.size()) {
    if (body.size() - at < 4) {
      error = detail::concat("truncated field length at byte ", at);
      return false;
    }
    const uint32_t len = get_u32(body.data() + at);
    at += 4;
    if (body.size() - at < len) {
      error = detail::concat("field of ", len, " bytes at byte ", at, " runs past the body's ",
                             body.size());
      return false;
    }
    fields.emplace_back(body.substr(at, len));
    at += len;
  }
  return true;
}

std::string quote(std::string_view key) {
  std::string out = "'";
  static const char* hex = "0123456789abcdef";
  for (unsigned char c : key) {
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\x";
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  out.push_back('\'');
  return out;
}

}  // namespace relaxcc::store_wire

#pragma once
// GPT-2's reversible byte <-> unicode map used by byte-level BPE vocabularies.
// Printable bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) map to the code point of the same value;
// the other 68 bytes map to U+0100, U+0101, ... in byte order (so ' ' -> 'Ġ', '\n' -> 'Ċ').
// Source: openai/gpt-2 encoder.py bytes_to_unicode().
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace dtr::tokenizer {

/// Code point that byte `b` maps to.
uint32_t byte_to_codepoint(uint8_t b);
/// UTF-8 of the mapped code point of every byte of `bytes` ("hi there" -> "hiĠthere").
std::string bytes_to_unicode(std::string_view bytes);
/// Inverse: the bytes of a mapped string. Returns false when a code point is not in the map
/// (the string is not byte-level), leaving `out` unspecified.
bool unicode_to_bytes(std::string_view mapped, std::string& out);

/// Appends the UTF-8 encoding of `cp` to `out`.
void append_utf8(uint32_t cp, std::string& out);
/// Length of the valid UTF-8 prefix of `s` (== s.size() when all of it is valid). Rejects
/// overlong forms, surrogates and code points above U+10FFFF.
size_t valid_utf8_prefix(std::string_view s);

}  // namespace dtr::tokenizer

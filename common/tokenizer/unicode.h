// UTF-8 and Unicode helpers for the tokenizer: validation, lossy decoding with
// Rust's String::from_utf8_lossy rules, character classes with Rust `char`
// semantics, utf8proc-based normalization and the GPT-2 byte<->char table.
// All functions are pure and thread-safe.
#ifndef PDSERVE_COMMON_TOKENIZER_UNICODE_H_
#define PDSERVE_COMMON_TOKENIZER_UNICODE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace pdserve::tok {

inline constexpr char32_t kReplacementChar = 0xFFFD;
inline constexpr std::string_view kReplacementUtf8 = "\xEF\xBF\xBD";

// Length of the valid UTF-8 sequence at p[0..n) (> 0), or -k where k >= 1 is
// the length of the maximal invalid subpart (Unicode "substitution of maximal
// subparts", which is what Rust and Python use for U+FFFD replacement).
int CheckUtf8Sequence(const unsigned char* p, size_t n);

// Byte offset of the first invalid UTF-8 sequence, or std::string_view::npos.
size_t FindInvalidUtf8(std::string_view s);

// Rust String::from_utf8_lossy: each maximal invalid subpart -> U+FFFD.
std::string Utf8Lossy(std::string_view bytes);

// Decodes the code point at s[*i] and advances *i. `s` must be valid UTF-8.
char32_t NextCodePoint(std::string_view s, size_t* i);
void AppendUtf8(char32_t cp, std::string* out);
// Byte length of the UTF-8 sequence starting with `lead` (1 for invalid).
int Utf8LeadLength(unsigned char lead);

// Character classes with Rust `char` semantics.
bool IsWhitespace(char32_t cp);    // White_Space property
bool IsNumeric(char32_t cp);       // Nd | Nl | No
bool IsAlphanumeric(char32_t cp);  // L* | N*
bool IsPunctuation(char32_t cp);   // ASCII punctuation | P*

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
// Unicode normalization of valid UTF-8 (utf8proc).
std::string NormalizeUnicode(std::string_view s, NormalForm form);
// Per-character lowercase (Rust char::to_lowercase, incl. U+0130).
std::string Lowercase(std::string_view s);

// GPT-2 bytes_to_unicode(): byte -> UTF-8 of its printable stand-in char.
const std::array<std::string, 256>& ByteLevelAlphabet();
// Inverse of ByteLevelAlphabet for one code point: the byte, or -1.
int ByteLevelCharToByte(char32_t cp);

}  // namespace pdserve::tok

#endif  // PDSERVE_COMMON_TOKENIZER_UNICODE_H_

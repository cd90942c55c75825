// Python `str` semantics over UTF-8: code point iteration and indexing,
// whitespace and character classes as CPython defines them, and case mapping
// (utf8proc simple mappings plus the few full mappings Python applies, such as
// "ß".upper() == "SS"). Invalid UTF-8 bytes count as one character each and
// are kept byte for byte. All functions are pure and thread-safe.
#ifndef PDSERVE_COMMON_CHAT_TEMPLATE_TEXT_H_
#define PDSERVE_COMMON_CHAT_TEMPLATE_TEXT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pdserve::jinja {

// Decodes the character at s[*i] and advances *i past it. An invalid byte
// decodes as U+FFFD and advances one byte.
char32_t NextChar(std::string_view s, size_t* i);
void AppendUtf8(char32_t cp, std::string* out);
bool IsValidUtf8(std::string_view s);

// Number of characters (Python len()).
size_t CharCount(std::string_view s);
// Byte offset of each character start, plus s.size() at the end.
std::vector<size_t> CharOffsets(std::string_view s);

// Character classes (CPython's unicodeobject.c definitions).
bool IsPySpace(char32_t cp);      // str.isspace / str.split() / strip()
bool IsPyPrintable(char32_t cp);  // str.isprintable (repr escapes the rest)
bool IsPyAlpha(char32_t cp);      // L*
bool IsPyDecimal(char32_t cp);    // Nd
bool IsPyDigit(char32_t cp);      // Nd and superscript/circled digits
bool IsPyNumeric(char32_t cp);    // Nd | Nl | No
bool IsPyAlnum(char32_t cp);
bool IsPyUpper(char32_t cp);
bool IsPyLower(char32_t cp);
bool IsPyTitle(char32_t cp);
bool IsPyCased(char32_t cp);
bool IsPyLinebreak(char32_t cp);  // str.splitlines boundaries
bool IsWordChar(char32_t cp);     // regex \w

// Case mapping of whole strings, as the str methods of the same names.
std::string PyUpper(std::string_view s);
std::string PyLower(std::string_view s);
std::string PyCapitalize(std::string_view s);
std::string PyTitle(std::string_view s);
std::string PySwapCase(std::string_view s);
// Title case of one character (for jinja's title filter).
void AppendTitleChar(char32_t cp, std::string* out);

// str.strip/lstrip/rstrip: `chars` null -> whitespace, else those characters.
std::string_view PyStrip(std::string_view s, const std::string* chars,
                         bool left, bool right);

}  // namespace pdserve::jinja

#endif  // PDSERVE_COMMON_CHAT_TEMPLATE_TEXT_H_

#include "common/tokenizer/unicode.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include "common/util/utf8.h"

namespace pdserve::tok {

int CheckUtf8Sequence(const unsigned char* p, size_t n) {
  return utf8::CheckSequence(p, n);
}

size_t FindInvalidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const int len = CheckUtf8Sequence(p + i, s.size() - i);
    if (len < 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t i = 0;
  while (i < bytes.size()) {
    const int len = CheckUtf8Sequence(p + i, bytes.size() - i);
    if (len > 0) {
      out.append(bytes.data() + i, len);
      i += len;
    } else {
      out.append(kReplacementUtf8);
      i += -len;
    }
  }
  return out;
}

int Utf8LeadLength(unsigned char lead) { return utf8::LeadLength(lead); }

char32_t NextCodePoint(std::string_view s, size_t* i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + *i;
  const int len = utf8::LeadLength(p[0]);
  *i += len;
  return utf8::DecodeValid(p, len);
}

void AppendUtf8(char32_t cp, std::string* out) { utf8::Append(cp, out); }

bool IsWhitespace(char32_t cp) {
  if (cp >= 0x09 && cp <= 0x0D) return true;
  switch (cp) {
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

namespace {
utf8proc_category_t Category(char32_t cp) {
  return static_cast<utf8proc_category_t>(
      utf8proc_category(static_cast<utf8proc_int32_t>(cp)));
}
}  // namespace

bool IsNumeric(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  const auto c = Category(cp);
  return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL ||
         c == UTF8PROC_CATEGORY_NO;
}

bool IsAlphanumeric(char32_t cp) {
  if (cp < 0x80) {
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') ||
           (cp >= 'A' && cp <= 'Z');
  }
  const auto c = Category(cp);
  return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
         c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL ||
         c == UTF8PROC_CATEGORY_NO;
}

bool IsPunctuation(char32_t cp) {
  if (cp < 0x80) {
    return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) ||
           (cp >= 0x5B && cp <= 0x60) || (cp >= 0x7B && cp <= 0x7E);
  }
  const auto c = Category(cp);
  return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

std::string NormalizeUnicode(std::string_view s, NormalForm form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNfc:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormalForm::kNfd:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalForm::kNfkc:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalForm::kNfkd:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                   static_cast<utf8proc_ssize_t>(s.size()), &dst,
                   static_cast<utf8proc_option_t>(options));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> holder(dst,
                                                                 &std::free);
  if (n < 0) return std::string(s);  // only for invalid input, never here
  return std::string(reinterpret_cast<const char*>(dst), n);
}

std::string Lowercase(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const char32_t cp = NextCodePoint(s, &i);
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp));
    } else if (cp == 0x130) {  // the only multi-char lowercase mapping
      out.append("i\xCC\x87");
    } else {
      AppendUtf8(static_cast<char32_t>(
                     utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))),
                 &out);
    }
  }
  return out;
}

namespace {
struct ByteLevelTables {
  std::array<std::string, 256> byte_to_utf8;
  std::array<int16_t, 512> char_to_byte;  // code points < 512 only
  ByteLevelTables() {
    char_to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') ||
                             (b >= 0xA1 && b <= 0xAC) ||
                             (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? b : 256 + n++;
      AppendUtf8(cp, &byte_to_utf8[b]);
      char_to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};
const ByteLevelTables& Tables() {
  static const ByteLevelTables tables;
  return tables;
}
}  // namespace

const std::array<std::string, 256>& ByteLevelAlphabet() {
  return Tables().byte_to_utf8;
}

int ByteLevelCharToByte(char32_t cp) {
  if (cp >= 512) return -1;
  return Tables().char_to_byte[cp];
}

}  // namespace pdserve::tok

#include "common/chat_template/text.h"

#include <utf8proc.h>

#include "common/util/utf8.h"

namespace pdserve::jinja {
namespace {

int Category(char32_t cp) {
  if (cp > 0x10FFFF) return UTF8PROC_CATEGORY_CN;
  return utf8proc_category(static_cast<utf8proc_int32_t>(cp));
}

char32_t SimpleUpper(char32_t cp) {
  return static_cast<char32_t>(utf8proc_toupper(static_cast<int32_t>(cp)));
}
char32_t SimpleLower(char32_t cp) {
  return static_cast<char32_t>(utf8proc_tolower(static_cast<int32_t>(cp)));
}
char32_t SimpleTitle(char32_t cp) {
  return static_cast<char32_t>(utf8proc_totitle(static_cast<int32_t>(cp)));
}

// The full (one-to-many) mappings of SpecialCasing.txt that Python applies
// and that occur in practice; everything else uses the simple mapping.
bool AppendSpecialUpper(char32_t cp, bool title, std::string* out) {
  const char* s = nullptr;
  switch (cp) {
    case 0x00DF:
      s = title ? "Ss" : "SS";
      break;
    case 0xFB00:
      s = title ? "Ff" : "FF";
      break;
    case 0xFB01:
      s = title ? "Fi" : "FI";
      break;
    case 0xFB02:
      s = title ? "Fl" : "FL";
      break;
    case 0xFB03:
      s = title ? "Ffi" : "FFI";
      break;
    case 0xFB04:
      s = title ? "Ffl" : "FFL";
      break;
    case 0xFB05:
    case 0xFB06:
      s = title ? "St" : "ST";
      break;
    case 0x0149:
      s = title ? "\u02BCN" : "\u02BCN";
      break;
    default:
      return false;
  }
  out->append(s);
  return true;
}

void AppendUpperChar(char32_t cp, std::string* out) {
  if (!AppendSpecialUpper(cp, false, out)) AppendUtf8(SimpleUpper(cp), out);
}

void AppendLowerChar(char32_t cp, std::string* out) {
  if (cp == 0x0130) {  // İ -> i + combining dot above
    out->append("i\u0307");
    return;
  }
  AppendUtf8(SimpleLower(cp), out);
}

template <typename F>
std::string MapChars(std::string_view s, F f) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const size_t start = i;
    const char32_t cp = NextChar(s, &i);
    if (cp == 0xFFFD && !(i - start == 3)) {
      out.append(s.substr(start, i - start));  // keep invalid bytes
      continue;
    }
    f(cp, &out);
  }
  return out;
}

}  // namespace

char32_t NextChar(std::string_view s, size_t* i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + *i;
  const int len = utf8::CheckSequence(p, s.size() - *i);
  if (len < 0) {  // Python's str keeps each invalid byte as one character
    ++*i;
    return 0xFFFD;
  }
  *i += len;
  return utf8::DecodeValid(p, len);
}

void AppendUtf8(char32_t cp, std::string* out) { utf8::Append(cp, out); }

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const size_t start = i;
    if (NextChar(s, &i) == 0xFFFD && i - start != 3) return false;
  }
  return true;
}

size_t CharCount(std::string_view s) {
  size_t count = 0, i = 0;
  while (i < s.size()) {
    NextChar(s, &i);
    ++count;
  }
  return count;
}

std::vector<size_t> CharOffsets(std::string_view s) {
  std::vector<size_t> offsets;
  offsets.reserve(s.size() + 1);
  size_t i = 0;
  while (i < s.size()) {
    offsets.push_back(i);
    NextChar(s, &i);
  }
  offsets.push_back(s.size());
  return offsets;
}

bool IsPySpace(char32_t cp) {
  switch (cp) {
    case ' ':
    case '\t':
    case '\n':
    case '\v':
    case '\f':
    case '\r':
    case 0x1C:
    case 0x1D:
    case 0x1E:
    case 0x1F:
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

bool IsPyPrintable(char32_t cp) {
  if (cp == ' ') return true;
  switch (Category(cp)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

bool IsPyAlpha(char32_t cp) {
  const int c = Category(cp);
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL ||
         c == UTF8PROC_CATEGORY_LT || c == UTF8PROC_CATEGORY_LM ||
         c == UTF8PROC_CATEGORY_LO;
}

bool IsPyDecimal(char32_t cp) { return Category(cp) == UTF8PROC_CATEGORY_ND; }

bool IsPyDigit(char32_t cp) {
  if (IsPyDecimal(cp)) return true;
  return cp == 0xB2 || cp == 0xB3 || cp == 0xB9 ||
         (cp >= 0x2070 && cp <= 0x2079 && cp != 0x2071 && cp != 0x2072 &&
          cp != 0x2073) ||
         (cp >= 0x2080 && cp <= 0x2089) || (cp >= 0x2460 && cp <= 0x2468) ||
         (cp >= 0x2474 && cp <= 0x247C) || (cp >= 0x2488 && cp <= 0x2490) ||
         cp == 0x24EA || (cp >= 0x24F5 && cp <= 0x24FD) || cp == 0x24FF ||
         (cp >= 0x2776 && cp <= 0x277E) || (cp >= 0x2780 && cp <= 0x2788) ||
         (cp >= 0x278A && cp <= 0x2792) || (cp >= 0x1369 && cp <= 0x1371);
}

bool IsPyNumeric(char32_t cp) {
  const int c = Category(cp);
  return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL ||
         c == UTF8PROC_CATEGORY_NO;
}

bool IsPyAlnum(char32_t cp) {
  return IsPyAlpha(cp) || IsPyDigit(cp) || IsPyNumeric(cp);
}

bool IsPyTitle(char32_t cp) { return Category(cp) == UTF8PROC_CATEGORY_LT; }

bool IsPyUpper(char32_t cp) {
  const int c = Category(cp);
  if (c == UTF8PROC_CATEGORY_LU) return true;
  return c != UTF8PROC_CATEGORY_LT && SimpleLower(cp) != cp;
}

bool IsPyLower(char32_t cp) {
  const int c = Category(cp);
  if (c == UTF8PROC_CATEGORY_LL) return true;
  return c != UTF8PROC_CATEGORY_LT && SimpleUpper(cp) != cp;
}

bool IsPyCased(char32_t cp) {
  return IsPyUpper(cp) || IsPyLower(cp) || IsPyTitle(cp);
}

bool IsPyLinebreak(char32_t cp) {
  switch (cp) {
    case '\n':
    case '\r':
    case '\v':
    case '\f':
    case 0x1C:
    case 0x1D:
    case 0x1E:
    case 0x85:
    case 0x2028:
    case 0x2029:
      return true;
    default:
      return false;
  }
}

bool IsWordChar(char32_t cp) { return cp == '_' || IsPyAlnum(cp); }

std::string PyUpper(std::string_view s) {
  return MapChars(
      s, [](char32_t cp, std::string* out) { AppendUpperChar(cp, out); });
}

std::string PyLower(std::string_view s) {
  return MapChars(
      s, [](char32_t cp, std::string* out) { AppendLowerChar(cp, out); });
}

void AppendTitleChar(char32_t cp, std::string* out) {
  if (!AppendSpecialUpper(cp, true, out)) AppendUtf8(SimpleTitle(cp), out);
}

std::string PyCapitalize(std::string_view s) {
  bool first = true;
  return MapChars(s, [&first](char32_t cp, std::string* out) {
    if (first) {
      AppendTitleChar(cp, out);
    } else {
      AppendLowerChar(cp, out);
    }
    first = false;
  });
}

std::string PyTitle(std::string_view s) {
  bool previous_cased = false;
  return MapChars(s, [&previous_cased](char32_t cp, std::string* out) {
    if (previous_cased) {
      AppendLowerChar(cp, out);
    } else {
      AppendTitleChar(cp, out);
    }
    previous_cased = IsPyCased(cp);
  });
}

std::string PySwapCase(std::string_view s) {
  return MapChars(s, [](char32_t cp, std::string* out) {
    if (IsPyUpper(cp)) {
      AppendLowerChar(cp, out);
    } else if (IsPyLower(cp)) {
      AppendUpperChar(cp, out);
    } else {
      AppendUtf8(cp, out);
    }
  });
}

std::string_view PyStrip(std::string_view s, const std::string* chars,
                         bool left, bool right) {
  std::vector<char32_t> set;
  if (chars != nullptr) {
    size_t i = 0;
    while (i < chars->size()) set.push_back(NextChar(*chars, &i));
  }
  auto strip_it = [&](char32_t cp) {
    if (chars == nullptr) return IsPySpace(cp);
    for (char32_t c : set) {
      if (c == cp) return true;
    }
    return false;
  };
  const std::vector<size_t> offsets = CharOffsets(s);
  auto char_at = [&](size_t k) {
    size_t j = offsets[k];
    return NextChar(s, &j);
  };
  size_t begin = 0, end = offsets.size() - 1;
  if (left) {
    while (begin < end && strip_it(char_at(begin))) ++begin;
  }
  if (right) {
    while (end > begin && strip_it(char_at(end - 1))) --end;
  }
  return s.substr(offsets[begin], offsets[end] - offsets[begin]);
}

}  // namespace pdserve::jinja

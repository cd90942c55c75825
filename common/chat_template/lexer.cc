#include "common/chat_template/lexer.h"

#include <cmath>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/chat_template/text.h"
#include "common/chat_template/value.h"

namespace pdserve::jinja {
namespace {

// Operators, longest first (jinja2.lexer.operator_re).
constexpr std::string_view kOperators[] = {
    "//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
    "]",  "(",  ")",  "{",  "}",  ">",  "<", "=", ".", ":", "|", ",", ";"};

bool IsSpaceAt(std::string_view s, size_t pos, size_t* next) {
  size_t i = pos;
  const char32_t cp = NextChar(s, &i);
  if (!IsPySpace(cp)) return false;
  *next = i;
  return true;
}

size_t SkipSpace(std::string_view s, size_t pos) {
  size_t next;
  while (pos < s.size() && IsSpaceAt(s, pos, &next)) pos = next;
  return pos;
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

class Lexer {
 public:
  Lexer(std::string source, std::string_view origin)
      : src_(std::move(source)), origin_(origin) {}

  absl::StatusOr<std::vector<Token>> Run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      // Earliest tag opener.
      size_t tag = src_.find('{', pos);
      while (tag != std::string::npos && tag + 1 < src_.size() &&
             src_[tag + 1] != '%' && src_[tag + 1] != '{' &&
             src_[tag + 1] != '#') {
        tag = src_.find('{', tag + 1);
      }
      if (tag == std::string::npos || tag + 1 >= src_.size()) {
        Emit(TokenType::kData, src_.substr(pos), pos);
        break;
      }
      const char kind = src_[tag + 1];
      size_t after = tag + 2;
      char sign = 0;
      if (after < src_.size() && (src_[after] == '-' || src_[after] == '+')) {
        sign = src_[after++];
      }
      // {% raw %} has priority at the same position.
      size_t raw_end = 0;
      bool raw_strip_after = false;
      const bool is_raw =
          kind == '%' && MatchRawBegin(after, &raw_end, &raw_strip_after);
      std::string text = src_.substr(pos, tag - pos);
      ApplyLeftStrip(&text, sign, kind != '{', line_starting);
      Emit(TokenType::kData, std::move(text), pos);
      if (is_raw) {
        auto end = LexRaw(raw_end, raw_strip_after, &line_starting);
        if (!end.ok()) return end.status();
        pos = *end;
        continue;
      }
      if (kind == '#') {
        auto end = LexComment(tag, after, &line_starting);
        if (!end.ok()) return end.status();
        pos = *end;
        continue;
      }
      auto end = LexTag(kind == '%', tag, after, &line_starting);
      if (!end.ok()) return end.status();
      pos = *end;
    }
    Token eof;
    eof.type = TokenType::kEof;
    eof.line = LineAt(src_.size());
    tokens_.push_back(std::move(eof));
    return std::move(tokens_);
  }

 private:
  int LineAt(size_t pos) {
    while (line_pos_ < pos && line_pos_ < src_.size()) {
      if (src_[line_pos_] == '\n') ++line_;
      ++line_pos_;
    }
    return line_;
  }

  absl::Status SyntaxError(size_t pos, std::string_view msg) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin_, ":", LineAt(pos), ": ", SV(msg)));
  }

  void Emit(TokenType type, std::string value, size_t pos) {
    if (type == TokenType::kData && value.empty()) return;
    Token t;
    t.type = type;
    t.value = std::move(value);
    t.line = LineAt(pos);
    tokens_.push_back(std::move(t));
  }

  // jinja2's OptionalLStrip: "-" strips all whitespace before the tag;
  // otherwise lstrip_blocks strips spaces/tabs back to the line start.
  void ApplyLeftStrip(std::string* text, char sign, bool lstrip_applies,
                      bool line_starting) {
    if (sign == '-') {
      *text = std::string(PyStrip(*text, nullptr, false, true));
      return;
    }
    if (sign == '+' || !lstrip_applies) return;
    const size_t nl = text->rfind('\n');
    const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if (l_pos == 0 && !line_starting) return;
    for (size_t i = l_pos; i < text->size(); ++i) {
      if ((*text)[i] != ' ' && (*text)[i] != '\t') return;
    }
    text->resize(l_pos);
  }

  // `\s*raw\s*(-%}\s*|%})` after "{%" and its sign.
  bool MatchRawBegin(size_t p, size_t* end, bool* strip_after) {
    p = SkipSpace(src_, p);
    if (src_.compare(p, 3, "raw") != 0) return false;
    p = SkipSpace(src_, p + 3);
    if (src_.compare(p, 3, "-%}") == 0) {
      *end = SkipSpace(src_, p + 3);
      *strip_after = true;
      return true;
    }
    if (src_.compare(p, 2, "%}") == 0) {
      *end = p + 2;
      *strip_after = false;
      return true;
    }
    return false;
  }

  absl::StatusOr<size_t> LexRaw(size_t body, bool /*strip_after*/,
                                bool* line_starting) {
    *line_starting = body > 0 && src_[body - 1] == '\n';
    size_t search = body;
    while (true) {
      const size_t open = src_.find("{%", search);
      if (open == std::string::npos) {
        return SyntaxError(body, "Missing end of raw directive");
      }
      size_t p = open + 2;
      char sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+'))
        sign = src_[p++];
      p = SkipSpace(src_, p);
      if (src_.compare(p, 6, "endraw") != 0) {
        search = open + 1;
        continue;
      }
      p = SkipSpace(src_, p + 6);
      size_t end;
      if (src_.compare(p, 3, "+%}") == 0) {
        end = p + 3;
      } else if (src_.compare(p, 3, "-%}") == 0) {
        end = SkipSpace(src_, p + 3);
      } else if (src_.compare(p, 2, "%}") == 0) {
        end = p + 2;
        if (end < src_.size() && src_[end] == '\n') ++end;
      } else {
        search = open + 1;
        continue;
      }
      std::string text = src_.substr(body, open - body);
      ApplyLeftStrip(&text, sign, true, *line_starting);
      Emit(TokenType::kData, std::move(text), body);
      *line_starting = src_[end - 1] == '\n';
      return end;
    }
  }

  absl::StatusOr<size_t> LexComment(size_t tag, size_t body,
                                    bool* line_starting) {
    const size_t close = src_.find("#}", body);
    if (close == std::string::npos) {
      return SyntaxError(tag, "Missing end of comment tag");
    }
    size_t end = close + 2;
    const char sign = close > body ? src_[close - 1] : 0;
    if (sign == '-') {
      end = SkipSpace(src_, end);
    } else if (sign != '+' && end < src_.size() && src_[end] == '\n') {
      ++end;
    }
    *line_starting = src_[end - 1] == '\n';
    return end;
  }

  absl::StatusOr<size_t> LexTag(bool block, size_t tag, size_t p,
                                bool* line_starting) {
    Emit(block ? TokenType::kBlockBegin : TokenType::kVariableBegin, "", tag);
    tokens_.back().value = block ? "{%" : "{{";
    std::vector<char> balance;
    while (p < src_.size()) {
      if (balance.empty()) {
        size_t end = 0;
        if (block) {
          if (src_.compare(p, 3, "+%}") == 0) {
            end = p + 3;
          } else if (src_.compare(p, 3, "-%}") == 0) {
            end = SkipSpace(src_, p + 3);
          } else if (src_.compare(p, 2, "%}") == 0) {
            end = p + 2;
            if (end < src_.size() && src_[end] == '\n') ++end;
          }
        } else if (src_.compare(p, 3, "-}}") == 0) {
          end = SkipSpace(src_, p + 3);
        } else if (src_.compare(p, 2, "}}") == 0) {
          end = p + 2;
        }
        if (end != 0) {
          Emit(block ? TokenType::kBlockEnd : TokenType::kVariableEnd, "", p);
          tokens_.back().value = block ? "%}" : "}}";
          *line_starting = src_[end - 1] == '\n';
          return end;
        }
      }
      size_t next;
      if (IsSpaceAt(src_, p, &next)) {
        p = SkipSpace(src_, p);
        continue;
      }
      auto number = LexNumber(p);
      if (!number.ok()) return number.status();
      if (*number > p) {
        p = *number;
        continue;
      }
      const char c = src_[p];
      if (c == '\'' || c == '"') {
        auto end = LexString(p);
        if (!end.ok()) return end.status();
        p = *end;
        continue;
      }
      size_t name_end = p;
      {
        size_t i = p;
        const char32_t cp = NextChar(src_, &i);
        if (cp == '_' || IsPyAlpha(cp)) {
          name_end = i;
          while (name_end < src_.size()) {
            size_t j = name_end;
            if (!IsWordChar(NextChar(src_, &j))) break;
            name_end = j;
          }
        }
      }
      if (name_end > p) {
        Emit(TokenType::kName, src_.substr(p, name_end - p), p);
        p = name_end;
        continue;
      }
      bool matched = false;
      for (std::string_view op : kOperators) {
        if (src_.compare(p, op.size(), op) != 0) continue;
        if (op == "{" || op == "(" || op == "[") {
          balance.push_back(op == "{" ? '}' : op == "(" ? ')' : ']');
        } else if (op == "}" || op == ")" || op == "]") {
          if (balance.empty()) {
            return SyntaxError(p, absl::StrCat("unexpected '", SV(op), "'"));
          }
          const char expected = balance.back();
          balance.pop_back();
          if (expected != op[0]) {
            return SyntaxError(
                p, absl::StrCat("unexpected '", SV(op), "', expected '",
                                std::string(1, expected), "'"));
          }
        }
        Emit(TokenType::kOperator, std::string(op), p);
        p += op.size();
        matched = true;
        break;
      }
      if (!matched) {
        std::string ch;
        size_t i = p;
        AppendStrRepr(
            std::string_view(src_).substr(p, (NextChar(src_, &i), i - p)), &ch);
        return SyntaxError(p, absl::StrCat("unexpected char ", ch, " at ", p));
      }
    }
    return p;  // end of source inside a tag: the parser reports it
  }

  // Jinja2's float_re then integer_re at p; returns p when neither matches.
  absl::StatusOr<size_t> LexNumber(size_t p) {
    if (!IsDigit(src_[p])) return p;
    auto digits = [&](size_t i) {  // (\d+_)*\d+ ; returns end or i
      size_t j = i;
      while (true) {
        const size_t start = j;
        while (j < src_.size() && IsDigit(src_[j])) ++j;
        if (j == start) return start == i ? i : start - 1;
        if (j < src_.size() && src_[j] == '_' && j + 1 < src_.size() &&
            IsDigit(src_[j + 1])) {
          ++j;
          continue;
        }
        return j;
      }
    };
    const bool after_dot = p > 0 && src_[p - 1] == '.';
    const size_t int_end = digits(p);
    if (!after_dot) {
      size_t q = int_end;
      bool has_frac = false;
      if (q < src_.size() && src_[q] == '.' && q + 1 < src_.size() &&
          IsDigit(src_[q + 1])) {
        q = digits(q + 1);
        has_frac = true;
      }
      size_t e = q;
      bool has_exp = false;
      if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
        size_t k = e + 1;
        if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
        if (k < src_.size() && IsDigit(src_[k])) {
          e = digits(k);
          has_exp = true;
        }
      }
      if (has_frac || has_exp) {
        const size_t end = has_exp ? e : q;
        std::string text;
        for (size_t i = p; i < end; ++i) {
          if (src_[i] != '_') text.push_back(src_[i]);
        }
        Emit(TokenType::kFloat, text, p);
        tokens_.back().float_value = std::strtod(text.c_str(), nullptr);
        return end;
      }
    }
    // Integers: 0b / 0o / 0x prefixes, [1-9](_?\d)*, 0(_?0)*.
    int base = 10;
    size_t i = p;
    if (src_[p] == '0' && p + 1 < src_.size()) {
      const char x = src_[p + 1] | 0x20;
      if (x == 'b' || x == 'o' || x == 'x') {
        base = x == 'b' ? 2 : x == 'o' ? 8 : 16;
        i = p + 2;
      }
    }
    auto is_base_digit = [base](char c) {
      if (base == 2) return c == '0' || c == '1';
      if (base == 8) return c >= '0' && c <= '7';
      if (base == 16)
        return IsDigit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f');
      return IsDigit(c);
    };
    std::string text;
    size_t end = i;
    if (base == 10) {
      if (src_[p] == '0') {
        end = p + 1;
        while (
            end < src_.size() &&
            (src_[end] == '0' || (src_[end] == '_' && end + 1 < src_.size() &&
                                  src_[end + 1] == '0'))) {
          ++end;
        }
      } else {
        end = digits(p);
      }
    } else {
      while (end < src_.size()) {
        if (is_base_digit(src_[end])) {
          ++end;
        } else if (src_[end] == '_' && end + 1 < src_.size() &&
                   is_base_digit(src_[end + 1])) {
          ++end;
        } else {
          break;
        }
      }
      if (end == i) {  // "0x" without digits: just the 0
        base = 10;
        end = p + 1;
        i = p;
      }
    }
    for (size_t k = i; k < end; ++k) {
      if (src_[k] != '_') text.push_back(src_[k]);
    }
    errno = 0;
    char* stop = nullptr;
    const unsigned long long v = std::strtoull(text.c_str(), &stop, base);
    if (errno == ERANGE || v > static_cast<unsigned long long>(INT64_MAX)) {
      return SyntaxError(p, "integer literal too large");
    }
    Emit(TokenType::kInteger, src_.substr(p, end - p), p);
    tokens_.back().int_value = static_cast<int64_t>(v);
    return end;
  }

  absl::StatusOr<size_t> LexString(size_t p) {
    const char quote = src_[p];
    size_t i = p + 1;
    while (i < src_.size() && src_[i] != quote) {
      if (src_[i] == '\\') ++i;
      ++i;
    }
    if (i >= src_.size()) {
      std::string ch;
      AppendStrRepr(std::string(1, quote), &ch);
      return SyntaxError(p, absl::StrCat("unexpected char ", ch, " at ", p));
    }
    auto decoded = Unescape(std::string_view(src_).substr(p + 1, i - p - 1), p);
    if (!decoded.ok()) return decoded.status();
    Emit(TokenType::kString, *std::move(decoded), p);
    return i + 1;
  }

  // Python's "unicode-escape" codec, as jinja2 applies it to literals.
  absl::StatusOr<std::string> Unescape(std::string_view s, size_t pos) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] != '\\' || i + 1 >= s.size()) {
        out.push_back(s[i]);
        continue;
      }
      const char c = s[++i];
      switch (c) {
        case '\n':
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '\'':
          out.push_back('\'');
          break;
        case '"':
          out.push_back('"');
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = c == 'x' ? 2 : c == 'u' ? 4 : 8;
          char32_t cp = 0;
          for (size_t k = 1; k <= n; ++k) {
            const char h = i + k < s.size() ? s[i + k] : 0;
            int d;
            if (IsDigit(h)) {
              d = h - '0';
            } else if ((h | 0x20) >= 'a' && (h | 0x20) <= 'f') {
              d = (h | 0x20) - 'a' + 10;
            } else {
              return SyntaxError(
                  pos, absl::StrCat("'unicodeescape' codec can't decode bytes: "
                                    "truncated \\",
                                    std::string(1, c), "XXXX escape"));
            }
            cp = cp * 16 + d;
          }
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            return SyntaxError(pos,
                               "'unicodeescape' codec can't decode bytes: "
                               "illegal Unicode character");
          }
          AppendUtf8(cp, &out);
          i += n;
          break;
        }
        default:
          if (c >= '0' && c <= '7') {
            char32_t cp = c - '0';
            for (int k = 0; k < 2 && i + 1 < s.size() && s[i + 1] >= '0' &&
                            s[i + 1] <= '7';
                 ++k) {
              cp = cp * 8 + (s[++i] - '0');
            }
            AppendUtf8(cp, &out);
          } else {
            out.push_back('\\');
            out.push_back(c);
          }
      }
    }
    return out;
  }

  std::string src_;
  std::string origin_;
  std::vector<Token> tokens_;
  int line_ = 1;
  size_t line_pos_ = 0;
};

// Jinja2 normalizes newlines to "\n" and drops one trailing newline.
std::string NormalizeNewlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

absl::StatusOr<std::vector<Token>> Tokenize(std::string_view source,
                                            std::string_view origin) {
  Lexer lexer(NormalizeNewlines(source), origin);
  return lexer.Run();
}

std::string DescribeToken(const Token& t) {
  switch (t.type) {
    case TokenType::kName:
      return t.value;
    case TokenType::kOperator:
      return t.value;
    case TokenType::kData:
      return "template data / text";
    case TokenType::kVariableBegin:
      return "begin of print statement";
    case TokenType::kVariableEnd:
      return "end of print statement";
    case TokenType::kBlockBegin:
      return "begin of statement block";
    case TokenType::kBlockEnd:
      return "end of statement block";
    case TokenType::kString:
      return "string";
    case TokenType::kInteger:
      return "integer";
    case TokenType::kFloat:
      return "float";
    case TokenType::kEof:
      return "end of template";
  }
  return "token";
}

}  // namespace pdserve::jinja

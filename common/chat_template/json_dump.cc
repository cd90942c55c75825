// json.dumps as transformers' tojson filter calls it.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/chat_template/pyformat.h"
#include "common/chat_template/text.h"

namespace pdserve::jinja {
namespace {

absl::Status Error(std::string msg) {
  return absl::InvalidArgumentError(std::move(msg));
}
// ---------------------------------------------------------------- json.dumps

void JsonString(std::string_view s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  size_t i = 0;
  char buf[16];
  while (i < s.size()) {
    const size_t start = i;
    const char32_t cp = NextChar(s, &i);
    switch (cp) {
      case '"':
        out->append("\\\"");
        continue;
      case '\\':
        out->append("\\\\");
        continue;
      case '\n':
        out->append("\\n");
        continue;
      case '\r':
        out->append("\\r");
        continue;
      case '\t':
        out->append("\\t");
        continue;
      case '\b':
        out->append("\\b");
        continue;
      case '\f':
        out->append("\\f");
        continue;
      default:
        break;
    }
    if (cp < 0x20) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
      out->append(buf);
    } else if (cp < 0x7F || !ensure_ascii) {
      out->append(s.substr(start, i - start));
    } else if (cp < 0x10000) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
      out->append(buf);
    } else {
      const unsigned v = static_cast<unsigned>(cp) - 0x10000;
      std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 | (v >> 10),
                    0xDC00 | (v & 0x3FF));
      out->append(buf);
    }
  }
  out->push_back('"');
}

std::string JsonFloat(double f) {
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return f > 0 ? "Infinity" : "-Infinity";
  return FloatRepr(f);
}

absl::StatusOr<bool> PyLess(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.AsDouble() < b.AsDouble();
  if (a.is_string() && b.is_string()) return a.str() < b.str();
  return Error(absl::StrCat("'<' not supported between instances of '",
                            TypeName(a), "' and '", TypeName(b), "'"));
}

class JsonWriter {
 public:
  JsonWriter(const JsonDumpOptions& o, size_t max_bytes, std::string* out)
      : o_(o), max_bytes_(max_bytes), out_(out) {}

  absl::Status Write(const Value& v, int level) {
    if (out_->size() > max_bytes_) return TooLarge(out_->size(), max_bytes_);
    if (level > kMaxNesting) {
      return Error(
          "maximum recursion depth exceeded while encoding a JSON object");
    }
    switch (v.kind()) {
      case Kind::kNone:
        out_->append("null");
        return absl::OkStatus();
      case Kind::kBool:
        out_->append(v.bool_value() ? "true" : "false");
        return absl::OkStatus();
      case Kind::kInt:
        absl::StrAppend(out_, v.int_value());
        return absl::OkStatus();
      case Kind::kFloat:
        out_->append(JsonFloat(v.float_value()));
        return absl::OkStatus();
      case Kind::kString:
        JsonString(v.str(), o_.ensure_ascii, out_);
        return absl::OkStatus();
      case Kind::kList:
        if (v.seq_kind() == SeqKind::kList || v.seq_kind() == SeqKind::kTuple) {
          return WriteList(v.list().items, level);
        }
        break;
      case Kind::kDict:
        return WriteDict(v.dict(), level);
      default:
        break;
    }
    return Error(absl::StrCat("Object of type ", TypeName(v),
                              " is not JSON serializable"));
  }

 private:
  void Newline(int level) {
    out_->push_back('\n');
    for (int i = 0; i < level; ++i) out_->append(*o_.indent);
  }

  absl::Status WriteList(const std::vector<Value>& items, int level) {
    if (items.empty()) {
      out_->append("[]");
      return absl::OkStatus();
    }
    out_->push_back('[');
    if (o_.indent) Newline(level + 1);
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) {
        out_->append(o_.item_separator);
        if (o_.indent) Newline(level + 1);
      }
      if (auto s = Write(items[i], level + 1); !s.ok()) return s;
    }
    if (o_.indent) Newline(level);
    out_->push_back(']');
    return absl::OkStatus();
  }

  absl::Status WriteDict(const DictData& d, int level) {
    if (d.size() == 0) {
      out_->append("{}");
      return absl::OkStatus();
    }
    std::vector<const std::pair<Value, Value>*> items;
    for (const auto& item : d.items()) items.push_back(&item);
    if (o_.sort_keys) {
      absl::Status status;
      std::stable_sort(items.begin(), items.end(),
                       [&status](const auto* a, const auto* b) {
                         auto less = PyLess(a->first, b->first);
                         if (!less.ok()) {
                           status = less.status();
                           return false;
                         }
                         return *less;
                       });
      if (!status.ok()) return status;
    }
    out_->push_back('{');
    if (o_.indent) Newline(level + 1);
    bool first = true;
    for (const auto* item : items) {
      if (!first) {
        out_->append(o_.item_separator);
        if (o_.indent) Newline(level + 1);
      }
      first = false;
      const Value& k = item->first;
      switch (k.kind()) {
        case Kind::kString:
          JsonString(k.str(), o_.ensure_ascii, out_);
          break;
        case Kind::kFloat:
          JsonString(JsonFloat(k.float_value()), false, out_);
          break;
        case Kind::kBool:
          out_->append(k.bool_value() ? "\"true\"" : "\"false\"");
          break;
        case Kind::kNone:
          out_->append("\"null\"");
          break;
        case Kind::kInt:
          absl::StrAppend(out_, "\"", k.int_value(), "\"");
          break;
        default:
          return Error(absl::StrCat(
              "keys must be str, int, float, bool or None, not ", TypeName(k)));
      }
      out_->append(o_.key_separator);
      if (auto s = Write(item->second, level + 1); !s.ok()) return s;
    }
    if (o_.indent) Newline(level);
    out_->push_back('}');
    return absl::OkStatus();
  }

  const JsonDumpOptions& o_;
  size_t max_bytes_;
  std::string* out_;
};

}  // namespace

absl::Status JsonDump(const Value& v, const JsonDumpOptions& options,
                      size_t max_bytes, std::string* out) {
  JsonWriter writer(options, max_bytes, out);
  if (auto s = writer.Write(v, 0); !s.ok()) return s;
  if (out->size() > max_bytes) return TooLarge(out->size(), max_bytes);
  return absl::OkStatus();
}

}  // namespace pdserve::jinja

// jinja2's sequence filters. Those that return generators in jinja2 (select,
// map, unique, batch, ...) return one-shot generator values here too, so
// truthiness, len() and re-iteration behave as in Python (they are computed
// eagerly, though).
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/chat_template/builtins.h"
#include "common/chat_template/text.h"
#include "common/util/status_macros.h"

namespace pdserve::jinja {
namespace {

using Args = std::vector<std::optional<Value>>;

Value Generator(std::vector<Value> items, std::string func_name,
                std::string type_name = "generator") {
  auto g = std::make_shared<GeneratorData>();
  g->items = std::move(items);
  g->func_name = std::move(func_name);
  g->type_name = std::move(type_name);
  return Value::Generator(std::move(g));
}

Value IgnoreCase(const Value& v) {
  return v.is_string() ? Value::String(PyLower(v.str())) : v;
}

// jinja2's make_attrgetter: "a.b.0" -> getitem(getitem(getitem(x, "a"), "b"),
// 0).
std::vector<Value> AttributeParts(const std::optional<Value>& attribute) {
  std::vector<Value> parts;
  if (!attribute || attribute->is_none()) return parts;
  if (!attribute->is_string()) return {*attribute};
  for (absl::string_view part : absl::StrSplit(attribute->str(), '.')) {
    const bool digits =
        !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
          return c >= '0' && c <= '9';
        });
    if (digits && part.size() < 18) {
      parts.push_back(Value::Int(std::stoll(std::string(part))));
    } else {
      parts.push_back(Value::String(std::string(part)));
    }
  }
  return parts;
}

absl::StatusOr<Value> GetPath(Renderer& r, Value item,
                              const std::vector<Value>& parts,
                              const std::optional<Value>& def = std::nullopt) {
  for (const Value& part : parts) {
    ASSIGN_OR_RETURN(item, r.GetItem(item, part));
    if (def && !def->is_none() && item.is_undefined()) item = *def;
  }
  return item;
}

absl::StatusOr<std::vector<Value>> Items(Renderer& r, const Value& v) {
  return r.Iterate(v);
}

// Python's sorted() comparison of key lists, errors included.
struct KeyLess {
  absl::Status* status;
  bool operator()(const std::vector<Value>& a,
                  const std::vector<Value>& b) const {
    if (!status->ok()) return false;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      if (Equals(a[i], b[i])) continue;
      auto less = Less(a[i], b[i]);
      if (!less.ok()) {
        *status = less.status();
        return false;
      }
      return *less;
    }
    return a.size() < b.size();
  }
};

absl::StatusOr<std::vector<Value>> SortBy(Renderer& r, std::vector<Value> items,
                                          std::vector<std::vector<Value>> keys,
                                          bool reverse) {
  RETURN_IF_ERROR(r.Step(static_cast<int64_t>(items.size()) * 4));
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  absl::Status status;
  KeyLess less{&status};
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return reverse ? less(keys[b], keys[a]) : less(keys[a], keys[b]);
  });
  RETURN_IF_ERROR(status);
  std::vector<Value> out;
  out.reserve(items.size());
  for (size_t i : order) out.push_back(std::move(items[i]));
  return out;
}

absl::StatusOr<Value> Sort(Renderer& r, const Value& v, CallArgs& a) {
  ASSIGN_OR_RETURN(
      Args args,
      BindArgs("do_sort", a, {"reverse", "case_sensitive", "attribute"}));
  const bool reverse = args[0] && Truthy(*args[0]);
  const bool case_sensitive = args[1] && Truthy(*args[1]);
  std::vector<std::vector<Value>> attr_parts;
  if (args[2] && args[2]->is_string()) {
    for (absl::string_view one : absl::StrSplit(args[2]->str(), ',')) {
      attr_parts.push_back(AttributeParts(Value::String(std::string(one))));
    }
  } else {
    attr_parts.push_back(AttributeParts(args[2]));
  }
  ASSIGN_OR_RETURN(std::vector<Value> items, Items(r, v));
  std::vector<std::vector<Value>> keys;
  for (const Value& item : items) {
    std::vector<Value> key;
    for (const auto& parts : attr_parts) {
      ASSIGN_OR_RETURN(Value k, GetPath(r, item, parts));
      key.push_back(case_sensitive ? k : IgnoreCase(k));
    }
    keys.push_back(std::move(key));
  }
  ASSIGN_OR_RETURN(items,
                   SortBy(r, std::move(items), std::move(keys), reverse));
  return Value::List(std::move(items));
}

absl::StatusOr<Value> DictSort(Renderer& r, const Value& v, CallArgs& a) {
  ASSIGN_OR_RETURN(Args args, BindArgs("do_dictsort", a,
                                       {"case_sensitive", "by", "reverse"}));
  const bool case_sensitive = args[0] && Truthy(*args[0]);
  const std::string by = args[1] ? Str(*args[1]) : "key";
  if (by != "key" && by != "value") {
    return RenderError("You can only sort by either \"key\" or \"value\"");
  }
  if (v.is_undefined()) return UndefinedError(v);
  if (!v.is_dict()) {
    return RenderError(
        absl::StrCat("'", TypeName(v), "' object has no attribute 'items'"));
  }
  std::vector<Value> items;
  std::vector<std::vector<Value>> keys;
  for (const auto& [k, val] : v.dict().items()) {
    items.push_back(Value::Tuple({k, val}));
    const Value& key = by == "key" ? k : val;
    keys.push_back({case_sensitive ? key : IgnoreCase(key)});
  }
  ASSIGN_OR_RETURN(items, SortBy(r, std::move(items), std::move(keys),
                                 args[2] && Truthy(*args[2])));
  return Value::List(std::move(items));
}

absl::StatusOr<Value> Unique(Renderer& r, const Value& v, CallArgs& a) {
  ASSIGN_OR_RETURN(Args args,
                   BindArgs("do_unique", a, {"case_sensitive", "attribute"}));
  const bool case_sensitive = args[0] && Truthy(*args[0]);
  const std::vector<Value> parts = AttributeParts(args[1]);
  ASSIGN_OR_RETURN(std::vector<Value> items, Items(r, v));
  RETURN_IF_ERROR(r.Step(static_cast<int64_t>(items.size())));
  std::vector<Value> seen, out;
  for (const Value& item : items) {
    ASSIGN_OR_RETURN(Value key, GetPath(r, item, parts));
    if (!case_sensitive) key = IgnoreCase(key);
    RETURN_IF_ERROR(CheckHashable(key));
    bool dup = false;
    for (const Value& s : seen) {
      if (Equals(s, key)) {
        dup = true;
        break;
      }
    }
    RETURN_IF_ERROR(r.Step(static_cast<int64_t>(seen.size() / 8)));
    if (dup) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Generator(std::move(out), "do_unique");
}

absl::StatusOr<Value> MinMax(Renderer& r, const Value& v, CallArgs& a,
                             bool max) {
  ASSIGN_OR_RETURN(Args args, BindArgs(max ? "do_max" : "do_min", a,
                                       {"case_sensitive", "attribute"}));
  const bool case_sensitive = args[0] && Truthy(*args[0]);
  const std::vector<Value> parts = AttributeParts(args[1]);
  ASSIGN_OR_RETURN(std::vector<Value> items, Items(r, v));
  if (items.empty()) {
    auto info = std::make_shared<UndefinedInfo>();
    info->hint = "No aggregated item, sequence was empty.";
    return Value::Undefined(std::move(info));
  }
  size_t best = 0;
  Value best_key;
  for (size_t i = 0; i < items.size(); ++i) {
    ASSIGN_OR_RETURN(Value key, GetPath(r, items[i], parts));
    if (!case_sensitive) key = IgnoreCase(key);
    if (i == 0) {
      best_key = key;
      continue;
    }
    ASSIGN_OR_RETURN(bool better,
                     max ? Less(best_key, key) : Less(key, best_key));
    if (better) {
      best = i;
      best_key = key;
    }
  }
  return items[best];
}

absl::StatusOr<Value> Sum(Renderer& r, const Value& v, CallArgs& a) {
  ASSIGN_OR_RETURN(Args args, BindArgs("do_sum", a, {"attribute", "start"}));
  const std::vector<Value> parts = AttributeParts(args[0]);
  Value total = args[1] ? *args[1] : Value::Int(0);
  if (total.is_string()) {
    return RenderError("sum() can't sum strings [use ''.join(seq) instead]");
  }
  ASSIGN_OR_RETURN(std::vector<Value> items, Items(r, v));
  for (const Value& item : items) {
    ASSIGN_OR_RETURN(Value x, GetPath(r, item, parts));
    ASSIGN_OR_RETURN(total, BinaryOp(r, BinOp::kAdd, total, x));
  }
  return total;
}

absl::StatusOr<Value> Join(Renderer& r, const Value& v, CallArgs& a) {
  ASSIGN_OR_RETURN(Args args, BindArgs("do_join", a, {"d", "attribute"}));
  const std::string sep = args[0] ? Str(*args[0]) : "";
  const std::vector<Value> parts = AttributeParts(args[1]);
  ASSIGN_OR_RETURN(std::vector<Value> items, Items(r, v));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += sep;
    ASSIGN_OR_RETURN(Value item, GetPath(r, items[i], parts));
    AppendStr(item, &out);
    RETURN_IF_ERROR(r.CheckString(out.size()));
  }
  RETURN_IF_ERROR(r.Step(static_cast<int64_t>(out.size() / 64)));
  return Value::String(std::move(out));
}

absl::StatusOr<Value> Length(Renderer& r, const Value& v, CallArgs& a) {
  RETURN_IF_ERROR(BindArgs("len", a, {}).status());
  switch (v.kind()) {
    case Kind::kUndefined:
      return Value::Int(0);
    case Kind::kString:
      return Value::Int(static_cast<int64_t>(CharCount(v.str())));
    case Kind::kList:
      return Value::Int(static_cast<int64_t>(v.list().items.size()));
    case Kind::kDict:
      return Value::Int(static_cast<int64_t>(v.dict().size()));
    case Kind::kNamespace:
      break;
    case Kind::kLoop:
      return Value::Int(static_cast<int64_t>(v.loop().items.size()));
    default:
      break;
  }
  return RenderError(
      absl::StrCat("object of type '", TypeName(v), "' has no len()"));
}

absl::StatusOr<Value> FirstLast(Renderer& r, const Value& v, CallArgs& a,
                                bool last) {
  RETURN_IF_ERROR(BindArgs(last ? "do_last" : "do_first", a, {}).status());
  if (last && v.kind() == Kind::kGenerator) {
    return RenderError(
        absl::StrCat("'", TypeName(v), "' object is not reversible"));
  }
  std::vector<Value> items;
  if (v.kind() == Kind::kGenerator && !last) {
    GeneratorData& g = v.generator();
    if (g.pos < g.items.size()) return g.items[g.pos++];
  } else {
    ASSIGN_OR_RETURN(items, Items(r, v));
  }
  if (items.empty()) {
    auto info = std::make_shared<UndefinedInfo>();
    info->hint = last ? "No last item, sequence was empty."
                      : "No first item, sequence was empty.";
    return Value::Undefined(std::move(info));
  }
  return last ? items.back() : items.front();
}

absl::StatusOr<Value> ItemsFilter(Renderer& r, const Value& v, CallArgs& a) {
  RETURN_IF_ERROR(BindArgs("do_items", a, {}).status());
  if (v.is_undefined()) return Generator({}, "do_items");
  if (!v.is_dict())
    return RenderError("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, val] : v.dict().items())
    out.push_back(Value::Tuple({k, val}));
  return Generator(std::move(out), "do_items");
}

absl::StatusOr<Value> Reverse(Renderer& r, const Value& v, CallArgs& a) {
  RETURN_IF_ERROR(BindArgs("do_reverse", a, {}).status());
  if (v.is_string()) {
    const std::string& str = v.str();
    const std::vector<size_t> off = CharOffsets(str);
    std::string out;
    out.reserve(str.size());
    for (size_t i = off.size() - 1; i > 0; --i) {
      out.append(str, off[i - 1], off[i] - off[i - 1]);
    }
    return Value::String(std::move(out));
  }
  if (v.kind() == Kind::kGenerator || v.is_undefined()) {
    ASSIGN_OR_RETURN(std::vector<Value> items, Items(r, v));
    std::reverse(items.begin(), items.end());
    return Value::List(std::move(items));
  }
  if (!v.is_list() && !v.is_dict()) {
    return RenderError("argument must be iterable");
  }
  ASSIGN_OR_RETURN(std::vector<Value> items, Items(r, v));
  std::reverse(items.begin(), items.end());
  std::string type = "list_reverseiterator";
  if (v.is_dict()) type = "dict_reversekeyiterator";
  if (v.is_list() && v.seq_kind() == SeqKind::kTuple) type = "reversed";
  return Generator(std::move(items), "", type);
}

absl::StatusOr<Value> Batch(Renderer& r, const Value& v, CallArgs& a) {
  ASSIGN_OR_RETURN(Args args,
                   BindArgs("do_batch", a, {"linecount", "fill_with"}));
  if (!args[0] || !args[0]->is_integral()) {
    return RenderError("do_batch() requires an integer linecount");
  }
  const int64_t n = args[0]->int_value();
  ASSIGN_OR_RETURN(std::vector<Value> items, Items(r, v));
  std::vector<Value> out, tmp;
  for (const Value& item : items) {
    if (static_cast<int64_t>(tmp.size()) == n) {
      out.push_back(Value::List(std::move(tmp)));
      tmp.clear();
    }
    tmp.push_back(item);
  }
  if (!tmp.empty()) {
    if (args[1] && !args[1]->is_none() &&
        static_cast<int64_t>(tmp.size()) < n) {
      RETURN_IF_ERROR(r.CheckItems(static_cast<size_t>(std::min<int64_t>(
          n, static_cast<int64_t>(r.limits().max_items) + 1))));
      while (static_cast<int64_t>(tmp.size()) < n) tmp.push_back(*args[1]);
    }
    out.push_back(Value::List(std::move(tmp)));
  }
  return Generator(std::move(out), "do_batch");
}

absl::StatusOr<Value> Slice(Renderer& r, const Value& v, CallArgs& a) {
  ASSIGN_OR_RETURN(Args args, BindArgs("do_slice", a, {"slices", "fill_with"}));
  if (!args[0] || !args[0]->is_integral()) {
    return RenderError("do_slice() requires an integer number of slices");
  }
  const int64_t slices = args[0]->int_value();
  if (slices <= 0) return RenderError("integer division or modulo by zero");
  if (slices > static_cast<int64_t>(r.limits().max_items)) {
    return r.CheckItems(static_cast<size_t>(slices));
  }
  ASSIGN_OR_RETURN(std::vector<Value> seq, Items(r, v));
  const int64_t length = static_cast<int64_t>(seq.size());
  const int64_t per = length / slices, extra = length % slices;
  int64_t offset = 0;
  std::vector<Value> out;
  for (int64_t n = 0; n < slices; ++n) {
    const int64_t start = offset + n * per;
    if (n < extra) ++offset;
    const int64_t end = offset + (n + 1) * per;
    std::vector<Value> tmp(seq.begin() + start, seq.begin() + end);
    if (args[1] && !args[1]->is_none() && n >= extra) tmp.push_back(*args[1]);
    out.push_back(Value::List(std::move(tmp)));
  }
  return Generator(std::move(out), "sync_do_slice");
}

absl::StatusOr<Value> Map(Renderer& r, const Value& v, CallArgs& a) {
  if (!Truthy(v)) return Generator({}, "sync_do_map");
  ASSIGN_OR_RETURN(std::vector<Value> items, Items(r, v));
  std::vector<Value> out;
  bool by_attribute = a.args.empty();
  std::optional<Value> attribute, def;
  if (by_attribute) {
    for (const auto& [k, val] : a.kwargs) {
      if (k == "attribute") {
        attribute = val;
      } else if (k == "default") {
        def = val;
      } else {
        return RenderError(
            absl::StrCat("Unexpected keyword argument '", k, "'"));
      }
    }
    if (!attribute) return RenderError("map requires a filter argument");
    const std::vector<Value> parts = AttributeParts(attribute);
    for (const Value& item : items) {
      ASSIGN_OR_RETURN(Value x, GetPath(r, item, parts, def));
      out.push_back(std::move(x));
    }
    return Generator(std::move(out), "sync_do_map");
  }
  const std::string name = Str(a.args[0]);
  if (!IsKnownFilter(name)) {
    return RenderError(absl::StrCat("No filter named '", name, "'."));
  }
  for (const Value& item : items) {
    CallArgs fa;
    fa.args.assign(a.args.begin() + 1, a.args.end());
    fa.kwargs = a.kwargs;
    ASSIGN_OR_RETURN(Value x, ApplyFilter(r, name, item, fa));
    out.push_back(std::move(x));
  }
  return Generator(std::move(out), "sync_do_map");
}

// select / reject / selectattr / rejectattr.
absl::StatusOr<Value> SelectOrReject(Renderer& r, const Value& v, CallArgs& a,
                                     bool select, bool by_attr) {
  if (!Truthy(v)) return Generator({}, "select_or_reject");
  size_t off = 0;
  std::vector<Value> parts;
  if (by_attr) {
    if (a.args.empty())
      return RenderError("Missing parameter for attribute name");
    parts = AttributeParts(a.args[0]);
    off = 1;
  }
  std::optional<std::string> test;
  CallArgs test_args;
  if (a.args.size() > off) {
    test = Str(a.args[off]);
    if (!IsKnownTest(*test)) {
      return RenderError(absl::StrCat("No test named '", *test, "'."));
    }
    test_args.args.assign(a.args.begin() + off + 1, a.args.end());
    test_args.kwargs = a.kwargs;
  }
  ASSIGN_OR_RETURN(std::vector<Value> items, Items(r, v));
  std::vector<Value> out;
  for (const Value& item : items) {
    RETURN_IF_ERROR(r.Step());
    ASSIGN_OR_RETURN(Value x, GetPath(r, item, parts));
    bool keep;
    if (test) {
      CallArgs ta = test_args;
      ASSIGN_OR_RETURN(keep, ApplyTest(r, *test, x, ta));
    } else {
      keep = Truthy(x);
    }
    if (keep == select) out.push_back(item);
  }
  return Generator(std::move(out), "select_or_reject");
}

}  // namespace

std::optional<absl::StatusOr<Value>> ApplySequenceFilter(Renderer& r,
                                                         std::string_view name,
                                                         const Value& v,
                                                         CallArgs& a) {
  if (name == "first") return FirstLast(r, v, a, false);
  if (name == "last") return FirstLast(r, v, a, true);
  if (name == "length" || name == "count") return Length(r, v, a);
  if (name == "list") {
    if (auto s = BindArgs("list", a, {}); !s.ok()) return s.status();
    auto items = Items(r, v);
    if (!items.ok()) return items.status();
    return Value::List(*std::move(items));
  }
  if (name == "join") return Join(r, v, a);
  if (name == "items") return ItemsFilter(r, v, a);
  if (name == "dictsort") return DictSort(r, v, a);
  if (name == "sort") return Sort(r, v, a);
  if (name == "unique") return Unique(r, v, a);
  if (name == "reverse") return Reverse(r, v, a);
  if (name == "batch") return Batch(r, v, a);
  if (name == "slice") return Slice(r, v, a);
  if (name == "min") return MinMax(r, v, a, false);
  if (name == "max") return MinMax(r, v, a, true);
  if (name == "sum") return Sum(r, v, a);
  if (name == "map") return Map(r, v, a);
  if (name == "select") return SelectOrReject(r, v, a, true, false);
  if (name == "reject") return SelectOrReject(r, v, a, false, false);
  if (name == "selectattr") return SelectOrReject(r, v, a, true, true);
  if (name == "rejectattr") return SelectOrReject(r, v, a, false, true);
  return std::nullopt;
}

}  // namespace pdserve::jinja

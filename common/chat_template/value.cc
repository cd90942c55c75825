#include "common/chat_template/value.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/chat_template/text.h"

namespace pdserve::jinja {

std::string UndefinedInfo::Message() const {
  if (!hint.empty()) return hint;
  if (!has_obj) return absl::StrCat("'", name, "' is undefined");
  if (!name_is_str) return absl::StrCat(obj_type, " has no element ", name);
  std::string out;
  AppendStrRepr(obj_type, &out);
  absl::StrAppend(&out, " has no attribute ");
  AppendStrRepr(name, &out);
  return out;
}

const Value* DictData::FindStr(std::string_view key) const {
  auto it = str_index_.find(SV(key));
  return it == str_index_.end() ? nullptr : &items_[it->second].second;
}

namespace {

// The int64 a numeric key hashes as, if it has one.
std::optional<int64_t> IntKey(const Value& key) {
  if (key.is_integral()) return key.int_value();
  if (key.is_float()) {
    const double f = key.float_value();
    if (f == std::floor(f) && std::fabs(f) < 9.2e18) {
      return static_cast<int64_t>(f);
    }
  }
  return std::nullopt;
}

}  // namespace

const Value* DictData::Find(const Value& key) const {
  if (key.is_string()) return FindStr(key.str());
  if (std::optional<int64_t> i = IntKey(key)) {
    auto it = int_index_.find(*i);
    return it == int_index_.end() ? nullptr : &items_[it->second].second;
  }
  for (const auto& [k, v] : items_) {
    if (!k.is_string() && !IntKey(k) && Equals(k, key)) return &v;
  }
  return nullptr;
}

void DictData::Set(Value key, Value value) {
  depth_ = std::max(depth_, 1 + NestingDepth(value));
  std::optional<size_t> slot;
  if (key.is_string()) {
    auto [it, inserted] = str_index_.try_emplace(key.str(), items_.size());
    if (!inserted) slot = it->second;
  } else if (std::optional<int64_t> i = IntKey(key)) {
    auto [it, inserted] = int_index_.try_emplace(*i, items_.size());
    if (!inserted) slot = it->second;
  } else {
    for (size_t k = 0; k < items_.size(); ++k) {
      const Value& existing = items_[k].first;
      if (!existing.is_string() && !IntKey(existing) && Equals(existing, key)) {
        slot = k;
        break;
      }
    }
  }
  if (slot) {  // Python keeps the first key and replaces the value
    items_[*slot].second = std::move(value);
    return;
  }
  depth_ = std::max(depth_, 1 + NestingDepth(key));
  items_.emplace_back(std::move(key), std::move(value));
}

std::optional<Value> Callable::Attribute(std::string_view name) const {
  return std::nullopt;
}

Value* NamespaceData::Find(std::string_view name) {
  for (auto& [k, v] : attrs) {
    if (k == name) return &v;
  }
  return nullptr;
}

Value Value::Undefined(std::shared_ptr<const UndefinedInfo> info) {
  Value v;
  v.ptr_ = std::const_pointer_cast<UndefinedInfo>(std::move(info));
  return v;
}

Value Value::UndefinedNamed(std::string name) {
  auto info = std::make_shared<UndefinedInfo>();
  info->name = std::move(name);
  return Undefined(std::move(info));
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.i_ = b ? 1 : 0;
  return v;
}

Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}

Value Value::Float(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = f;
  return v;
}

Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.str_ = std::make_shared<const std::string>(std::move(s));
  return v;
}

Value Value::List(std::vector<Value> items, SeqKind kind) {
  auto data = std::make_shared<ListData>();
  int depth = 1;
  for (const Value& item : items)
    depth = std::max(depth, 1 + NestingDepth(item));
  data->items = std::move(items);
  data->kind = kind;
  data->depth = depth;
  Value v;
  v.kind_ = Kind::kList;
  v.ptr_ = std::move(data);
  return v;
}

Value Value::Tuple(std::vector<Value> items) {
  return List(std::move(items), SeqKind::kTuple);
}

Value Value::Dict(std::shared_ptr<const DictData> dict) {
  Value v;
  v.kind_ = Kind::kDict;
  v.ptr_ = std::const_pointer_cast<DictData>(std::move(dict));
  return v;
}

Value Value::Callable(std::shared_ptr<const jinja::Callable> fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.ptr_ = std::const_pointer_cast<jinja::Callable>(std::move(fn));
  return v;
}

Value Value::Namespace(std::shared_ptr<NamespaceData> ns) {
  Value v;
  v.kind_ = Kind::kNamespace;
  v.ptr_ = std::move(ns);
  return v;
}

Value Value::Loop(std::shared_ptr<LoopData> loop) {
  Value v;
  v.kind_ = Kind::kLoop;
  v.ptr_ = std::move(loop);
  return v;
}

Value Value::Generator(std::shared_ptr<GeneratorData> gen) {
  Value v;
  v.kind_ = Kind::kGenerator;
  v.ptr_ = std::move(gen);
  return v;
}

int NestingDepth(const Value& v) {
  switch (v.kind()) {
    case Kind::kList:
      return v.list().depth;
    case Kind::kDict:
      return v.dict().depth();
    case Kind::kNamespace:
    case Kind::kLoop:
    case Kind::kGenerator:
      return 1;
    default:
      return 0;
  }
}

bool Truthy(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
    case Kind::kInt:
      return v.int_value() != 0;
    case Kind::kFloat:
      return v.float_value() != 0.0;
    case Kind::kString:
      return !v.str().empty();
    case Kind::kList:
      return !v.list().items.empty();
    case Kind::kDict:
      return v.dict().size() > 0;
    default:
      return true;
  }
}

namespace {

bool EqualsDepth(const Value& a, const Value& b, int depth) {
  if (depth > kMaxNesting) return false;
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral())
      return a.int_value() == b.int_value();
    return a.AsDouble() == b.AsDouble();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return a.str() == b.str();
    case Kind::kList: {
      const ListData& x = a.list();
      const ListData& y = b.list();
      if (x.kind != y.kind) return false;
      if (x.kind == SeqKind::kDictValues) return &x == &y;
      if (x.items.size() != y.items.size()) return false;
      if (x.kind == SeqKind::kDictKeys || x.kind == SeqKind::kDictItems) {
        for (const Value& item : x.items) {
          bool found = false;
          for (const Value& other : y.items) {
            if (EqualsDepth(item, other, depth + 1)) {
              found = true;
              break;
            }
          }
          if (!found) return false;
        }
        return true;
      }
      for (size_t i = 0; i < x.items.size(); ++i) {
        if (!EqualsDepth(x.items[i], y.items[i], depth + 1)) return false;
      }
      return true;
    }
    case Kind::kDict: {
      const DictData& x = a.dict();
      const DictData& y = b.dict();
      if (x.size() != y.size()) return false;
      for (const auto& [k, v] : x.items()) {
        const Value* other = y.Find(k);
        if (other == nullptr || !EqualsDepth(v, *other, depth + 1))
          return false;
      }
      return true;
    }
    default:
      return a.identity() == b.identity();
  }
}

}  // namespace

bool Equals(const Value& a, const Value& b) { return EqualsDepth(a, b, 0); }

std::string TypeName(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      switch (v.seq_kind()) {
        case SeqKind::kList:
          return "list";
        case SeqKind::kTuple:
          return "tuple";
        case SeqKind::kDictKeys:
          return "dict_keys";
        case SeqKind::kDictValues:
          return "dict_values";
        case SeqKind::kDictItems:
          return "dict_items";
      }
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kCallable:
      return v.callable().TypeName();
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kLoop:
      return "LoopContext";
    case Kind::kGenerator:
      return v.generator().type_name;
  }
  return "object";
}

std::string ObjectTypeRepr(const Value& v) {
  switch (v.kind()) {
    case Kind::kNone:
      return "None";
    case Kind::kUndefined:
      return "jinja2.runtime.Undefined object";
    case Kind::kNamespace:
      return "jinja2.utils.Namespace object";
    case Kind::kLoop:
      return "jinja2.runtime.LoopContext object";
    default: {
      const std::string name = TypeName(v);
      if (name == "Macro") return "jinja2.runtime.Macro object";
      return name + " object";
    }
  }
}

namespace {

absl::StatusOr<Value> FromJsonDepth(const nlohmann::ordered_json& j,
                                    int depth) {
  if (depth > kMaxNesting) {
    return absl::InvalidArgumentError(
        absl::StrCat("input JSON nested deeper than ", kMaxNesting, " levels"));
  }
  using T = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case T::null:
    case T::discarded:
      return Value::None();
    case T::boolean:
      return Value::Bool(j.get<bool>());
    case T::number_integer:
      return Value::Int(j.get<int64_t>());
    case T::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) {
        return Value::Float(static_cast<double>(u));
      }
      return Value::Int(static_cast<int64_t>(u));
    }
    case T::number_float:
      return Value::Float(j.get<double>());
    case T::string:
      return Value::String(j.get<std::string>());
    case T::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& item : j) {
        auto v = FromJsonDepth(item, depth + 1);
        if (!v.ok()) return v.status();
        items.push_back(*std::move(v));
      }
      return Value::List(std::move(items));
    }
    case T::object: {
      auto dict = std::make_shared<DictData>();
      for (const auto& [key, item] : j.items()) {
        auto v = FromJsonDepth(item, depth + 1);
        if (!v.ok()) return v.status();
        dict->Set(Value::String(key), *std::move(v));
      }
      return Value::Dict(std::move(dict));
    }
    case T::binary:
      return absl::InvalidArgumentError("binary JSON values are not supported");
  }
  return Value::None();
}

}  // namespace

absl::StatusOr<Value> FromJson(const nlohmann::ordered_json& j) {
  return FromJsonDepth(j, 0);
}

bool HasSafeRepr(const Value& v) {
  if (v.is_none() || v.is_number() || v.is_string()) return true;
  if (v.is_list()) {
    if (v.seq_kind() != SeqKind::kList && v.seq_kind() != SeqKind::kTuple) {
      return false;
    }
    for (const Value& item : v.list().items) {
      if (!HasSafeRepr(item)) return false;
    }
    return true;
  }
  if (v.is_dict()) {
    for (const auto& [key, value] : v.dict().items()) {
      if (!HasSafeRepr(key) || !HasSafeRepr(value)) return false;
    }
    return true;
  }
  return false;
}

}  // namespace pdserve::jinja

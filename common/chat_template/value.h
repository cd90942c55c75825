// The value model of the template engine: Python objects as Jinja2 sees them
// (None, bool, int, float, str, list/tuple, dict with insertion order, jinja2
// Undefined, callables, namespace, loop, generator) and the Python semantics
// every part of the engine shares: truthiness, ==, ordering, str() and
// repr(), type names. Values are cheap to copy (immutable payloads shared by
// pointer); the few mutable objects (namespace, loop, generator) belong to one
// render, which runs on one thread.
#ifndef PDSERVE_COMMON_CHAT_TEMPLATE_VALUE_H_
#define PDSERVE_COMMON_CHAT_TEMPLATE_VALUE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace pdserve::jinja {

// absl::StrCat takes absl::string_view, which this Abseil build does not
// alias to std::string_view.
inline absl::string_view SV(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}

class Renderer;
class Value;
struct CallArgs;

enum class Kind : uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,  // list, tuple and the dict views (SeqKind)
  kDict,
  kCallable,
  kNamespace,
  kLoop,
  kGenerator,  // a one-shot iterator (select, map, reversed, ...)
};

enum class SeqKind : uint8_t {
  kList,
  kTuple,
  kDictKeys,
  kDictValues,
  kDictItems
};

// Why a value is undefined; formats jinja2's Undefined error message.
// Immutable once attached to a Value.
struct UndefinedInfo {
  std::string name;      // variable, attribute, or repr() of an item key
  std::string obj_type;  // object_type_repr() of the owner ("dict object")
  bool has_obj = false;
  bool name_is_str = true;
  std::string hint;  // replaces the message when set
  std::string Message() const;
};

// The items of a list, tuple or dict view. Immutable once wrapped in a Value
// (the sandbox forbids mutating methods), so Values share it freely.
struct ListData {
  std::vector<Value> items;
  SeqKind kind = SeqKind::kList;
  int depth = 1;  // nesting depth (1 + deepest item)
};

// A dict: insertion order kept (as Python's), string and integer keys
// indexed. Built once, then immutable while a Value holds it.
class DictData {
 public:
  const Value* Find(const Value& key) const;
  const Value* FindStr(std::string_view key) const;
  // Inserts or replaces (keeping the original position, as Python does).
  void Set(Value key, Value value);
  const std::vector<std::pair<Value, Value>>& items() const { return items_; }
  size_t size() const { return items_.size(); }
  int depth() const { return depth_; }

 private:
  int depth_ = 1;
  std::vector<std::pair<Value, Value>> items_;
  absl::flat_hash_map<std::string, size_t> str_index_;
  // bool/int keys and integral floats (Python: 1 == 1.0 == True).
  absl::flat_hash_map<int64_t, size_t> int_index_;
};

// Macros, builtin functions and bound methods. Calls run on the render's
// thread; builtins are stateless (a joiner's state is per render).
class Callable {
 public:
  virtual ~Callable() = default;
  virtual absl::StatusOr<Value> Call(Renderer& r, CallArgs& args) const = 0;
  virtual std::string Repr() const = 0;
  virtual std::string TypeName() const = 0;  // Python type(x).__name__
  // Data attributes (a macro's name, arguments, ...), if any.
  virtual std::optional<Value> Attribute(std::string_view name) const;
};

// jinja2.utils.Namespace: the only object templates may assign attributes to.
// Mutable; created by and confined to one render.
struct NamespaceData {
  std::vector<std::pair<std::string, Value>> attrs;
  Value* Find(std::string_view name);
};

struct LoopData;  // defined by the evaluator

// A one-shot iterator (what jinja2's select, map, unique... return): its
// items and how many were consumed. Mutable; confined to one render.
struct GeneratorData {
  std::vector<Value> items;
  size_t pos = 0;
  std::string type_name;  // "generator", "list_reverseiterator", ...
  std::string func_name;  // shown by repr(): select_or_reject, ...
};

// One template value. Copying shares the payload (immutable for strings,
// lists and dicts), so values may be copied across threads; the mutable
// payloads (namespace, loop, generator) only exist inside one render.
class Value {
 public:
  Value() = default;  // an anonymous Undefined
  static Value Undefined(std::shared_ptr<const UndefinedInfo> info);
  static Value UndefinedNamed(std::string name);
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value String(std::string s);
  static Value List(std::vector<Value> items, SeqKind kind = SeqKind::kList);
  static Value Tuple(std::vector<Value> items);
  static Value Dict(std::shared_ptr<const DictData> dict);
  static Value Callable(std::shared_ptr<const jinja::Callable> fn);
  static Value Namespace(std::shared_ptr<NamespaceData> ns);
  static Value Loop(std::shared_ptr<LoopData> loop);
  static Value Generator(std::shared_ptr<GeneratorData> gen);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_callable() const { return kind_ == Kind::kCallable; }
  // bool, int or float (Python numbers.Number).
  bool is_number() const {
    return kind_ == Kind::kBool || kind_ == Kind::kInt || kind_ == Kind::kFloat;
  }
  // bool or int (Python int, of which bool is a subclass).
  bool is_integral() const {
    return kind_ == Kind::kBool || kind_ == Kind::kInt;
  }

  bool bool_value() const { return i_ != 0; }
  int64_t int_value() const { return i_; }  // bool or int
  double float_value() const { return f_; }
  double AsDouble() const {
    return kind_ == Kind::kFloat ? f_ : static_cast<double>(i_);
  }
  const std::string& str() const { return *str_; }
  const ListData& list() const {
    return *static_cast<const ListData*>(ptr_.get());
  }
  SeqKind seq_kind() const { return list().kind; }
  const DictData& dict() const {
    return *static_cast<const DictData*>(ptr_.get());
  }
  const jinja::Callable& callable() const {
    return *static_cast<const jinja::Callable*>(ptr_.get());
  }
  NamespaceData& ns() const { return *static_cast<NamespaceData*>(ptr_.get()); }
  LoopData& loop() const { return *static_cast<LoopData*>(ptr_.get()); }
  GeneratorData& generator() const {
    return *static_cast<GeneratorData*>(ptr_.get());
  }
  const UndefinedInfo* undefined_info() const {
    return static_cast<const UndefinedInfo*>(ptr_.get());
  }
  // Identity of the shared payload (Python `is` for containers).
  const void* identity() const { return ptr_ ? ptr_.get() : str_.get(); }

 private:
  Kind kind_ = Kind::kUndefined;
  union {
    int64_t i_ = 0;
    double f_;
  };
  std::shared_ptr<const std::string> str_;
  std::shared_ptr<void> ptr_;
};

// Python semantics shared by the engine.
bool Truthy(const Value& v);
bool Equals(const Value& a, const Value& b);
std::string TypeName(const Value& v);        // type(v).__name__
std::string ObjectTypeRepr(const Value& v);  // jinja2.utils.object_type_repr
void AppendStr(const Value& v, std::string* out);  // str(v); Undefined: ""
void AppendRepr(const Value& v, std::string* out);
std::string Str(const Value& v);
std::string Repr(const Value& v);
// jinja2.compiler.has_safe_repr: None, bool, int, float, str, and tuples,
// lists and dicts of those (what jinja2 folds a constant into).
bool HasSafeRepr(const Value& v);
std::string FloatRepr(double f);                           // Python repr(float)
void AppendStrRepr(std::string_view s, std::string* out);  // repr(str)
// Nesting depth of lists/dicts (0 for scalars, 1 for other objects). The
// evaluator refuses to build values nested deeper than kMaxNesting, and the
// recursive functions here stop descending there.
int NestingDepth(const Value& v);
inline constexpr int kMaxNesting = 256;
std::string LoopRepr(const LoopData& loop);  // defined by the evaluator

// JSON (ordered objects keep their key order) -> Value. Integers stay int,
// floats float. INVALID_ARGUMENT when nested deeper than kMaxNesting.
absl::StatusOr<Value> FromJson(const nlohmann::ordered_json& j);

}  // namespace pdserve::jinja

#endif  // PDSERVE_COMMON_CHAT_TEMPLATE_VALUE_H_

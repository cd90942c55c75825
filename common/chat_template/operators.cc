// Python operator semantics: arithmetic on 64-bit ints and doubles (int
// overflow is an error rather than a big int), sequence concatenation and
// repetition with size checks, comparisons and `in`.
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/chat_template/builtins.h"
#include "common/chat_template/pyformat.h"
#include "common/util/status_macros.h"

namespace pdserve::jinja {
namespace {

const char* OpSymbol(BinOp op) {
  switch (op) {
    case BinOp::kAdd:
      return "+";
    case BinOp::kSub:
      return "-";
    case BinOp::kMul:
      return "*";
    case BinOp::kDiv:
      return "/";
    case BinOp::kFloorDiv:
      return "//";
    case BinOp::kMod:
      return "%";
    case BinOp::kPow:
      return "** or pow()";
  }
  return "?";
}

const char* CmpSymbol(CmpOp op) {
  switch (op) {
    case CmpOp::kLt:
      return "<";
    case CmpOp::kLe:
      return "<=";
    case CmpOp::kGt:
      return ">";
    case CmpOp::kGe:
      return ">=";
    default:
      return "==";
  }
}

absl::Status Unsupported(BinOp op, const Value& a, const Value& b) {
  return RenderError(absl::StrCat("unsupported operand type(s) for ",
                                  OpSymbol(op), ": '", TypeName(a), "' and '",
                                  TypeName(b), "'"));
}

absl::Status Overflow() {
  return RenderError(
      "integer overflow (the chat template engine uses 64-bit "
      "integers)");
}

bool IsSeq(const Value& v) {
  return v.is_list() &&
         (v.seq_kind() == SeqKind::kList || v.seq_kind() == SeqKind::kTuple);
}

absl::StatusOr<Value> Repeat(Renderer& r, const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    const size_t len = seq.str().size();
    if (len > 0 &&
        static_cast<uint64_t>(n) > r.limits().max_string_bytes / len) {
      return TooLarge(static_cast<size_t>(std::min<uint64_t>(
                          static_cast<uint64_t>(n) * len, SIZE_MAX / 2)),
                      r.limits().max_string_bytes);
    }
    RETURN_IF_ERROR(r.Step(static_cast<int64_t>(len * n / 64)));
    std::string out;
    out.reserve(len * n);
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value::String(std::move(out));
  }
  const auto& items = seq.list().items;
  if (!items.empty() &&
      static_cast<uint64_t>(n) > r.limits().max_items / items.size()) {
    return r.CheckItems(r.limits().max_items + 1);
  }
  RETURN_IF_ERROR(r.Step(static_cast<int64_t>(items.size() * n / 4)));
  std::vector<Value> out;
  out.reserve(items.size() * n);
  for (int64_t i = 0; i < n; ++i)
    out.insert(out.end(), items.begin(), items.end());
  return Value::List(std::move(out), seq.seq_kind());
}

absl::StatusOr<Value> IntPow(int64_t base, int64_t exp) {
  int64_t result = 1;
  while (exp > 0) {
    if (exp & 1) {
      if (__builtin_mul_overflow(result, base, &result)) return Overflow();
    }
    exp >>= 1;
    if (exp > 0 && __builtin_mul_overflow(base, base, &base)) return Overflow();
  }
  return Value::Int(result);
}

absl::StatusOr<Value> FloatOp(BinOp op, double x, double y) {
  switch (op) {
    case BinOp::kAdd:
      return Value::Float(x + y);
    case BinOp::kSub:
      return Value::Float(x - y);
    case BinOp::kMul:
      return Value::Float(x * y);
    case BinOp::kDiv:
      if (y == 0) return RenderError("float division by zero");
      return Value::Float(x / y);
    case BinOp::kFloorDiv:
    case BinOp::kMod: {
      if (y == 0) {
        return RenderError(op == BinOp::kMod ? "float modulo"
                                             : "float floor division by zero");
      }
      double mod = std::fmod(x, y);
      double div = (x - mod) / y;
      if (mod != 0) {
        if ((y < 0) != (mod < 0)) {
          mod += y;
          div -= 1.0;
        }
      } else {
        mod = std::copysign(0.0, y);
      }
      double floordiv;
      if (div != 0) {
        floordiv = std::floor(div);
        if (div - floordiv > 0.5) floordiv += 1.0;
      } else {
        floordiv = std::copysign(0.0, x / y);
      }
      return Value::Float(op == BinOp::kMod ? mod : floordiv);
    }
    case BinOp::kPow: {
      if (x == 0 && y < 0) {
        return RenderError("0.0 cannot be raised to a negative power");
      }
      if (x < 0 && std::isfinite(y) && y != std::floor(y)) {
        return RenderError("complex numbers are not supported");
      }
      const double r = std::pow(x, y);
      if (std::isinf(r) && std::isfinite(x) && std::isfinite(y)) {
        return RenderError("(34, 'Numerical result out of range')");
      }
      return Value::Float(r);
    }
  }
  return Value::Float(0);
}

absl::StatusOr<Value> IntOp(BinOp op, int64_t a, int64_t b) {
  int64_t r;
  switch (op) {
    case BinOp::kAdd:
      if (__builtin_add_overflow(a, b, &r)) return Overflow();
      return Value::Int(r);
    case BinOp::kSub:
      if (__builtin_sub_overflow(a, b, &r)) return Overflow();
      return Value::Int(r);
    case BinOp::kMul:
      if (__builtin_mul_overflow(a, b, &r)) return Overflow();
      return Value::Int(r);
    case BinOp::kDiv:
      if (b == 0) return RenderError("division by zero");
      return Value::Float(static_cast<double>(a) / static_cast<double>(b));
    case BinOp::kFloorDiv: {
      if (b == 0) return RenderError("integer division or modulo by zero");
      if (a == INT64_MIN && b == -1) return Overflow();
      int64_t q = a / b;
      if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
      return Value::Int(q);
    }
    case BinOp::kMod: {
      if (b == 0) return RenderError("integer modulo by zero");
      if (b == -1) return Value::Int(0);
      int64_t m = a % b;
      if (m != 0 && ((m < 0) != (b < 0))) m += b;
      return Value::Int(m);
    }
    case BinOp::kPow:
      if (b < 0)
        return FloatOp(op, static_cast<double>(a), static_cast<double>(b));
      return IntPow(a, b);
  }
  return Value::Int(0);
}

// a < b (or >, <=, >=) for the types Python orders.
absl::StatusOr<bool> Order(CmpOp op, const Value& a, const Value& b) {
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) {
      const int64_t x = a.int_value(), y = b.int_value();
      switch (op) {
        case CmpOp::kLt:
          return x < y;
        case CmpOp::kLe:
          return x <= y;
        case CmpOp::kGt:
          return x > y;
        default:
          return x >= y;
      }
    }
    const double x = a.AsDouble(), y = b.AsDouble();
    switch (op) {
      case CmpOp::kLt:
        return x < y;
      case CmpOp::kLe:
        return x <= y;
      case CmpOp::kGt:
        return x > y;
      default:
        return x >= y;
    }
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.str().compare(b.str());
    switch (op) {
      case CmpOp::kLt:
        return c < 0;
      case CmpOp::kLe:
        return c <= 0;
      case CmpOp::kGt:
        return c > 0;
      default:
        return c >= 0;
    }
  }
  if (IsSeq(a) && IsSeq(b) && a.seq_kind() == b.seq_kind()) {
    const auto& x = a.list().items;
    const auto& y = b.list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!Equals(x[i], y[i])) {
        const CmpOp strict =
            (op == CmpOp::kLt || op == CmpOp::kLe) ? CmpOp::kLt : CmpOp::kGt;
        return Order(strict, x[i], y[i]);
      }
    }
    return Order(op, Value::Int(static_cast<int64_t>(x.size())),
                 Value::Int(static_cast<int64_t>(y.size())));
  }
  return RenderError(absl::StrCat("'", CmpSymbol(op),
                                  "' not supported between instances of '",
                                  TypeName(a), "' and '", TypeName(b), "'"));
}

}  // namespace

absl::StatusOr<Value> BinaryOp(Renderer& r, BinOp op, const Value& a,
                               const Value& b) {
  if (op == BinOp::kMod && a.is_string()) {
    ASSIGN_OR_RETURN(std::string s,
                     PercentFormat(a.str(), b, r.limits().max_string_bytes));
    return Value::String(std::move(s));
  }
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) {
      return IntOp(op, a.int_value(), b.int_value());
    }
    return FloatOp(op, a.AsDouble(), b.AsDouble());
  }
  if (op == BinOp::kAdd) {
    if (a.is_string()) {
      if (!b.is_string()) {
        return RenderError(absl::StrCat("can only concatenate str (not \"",
                                        TypeName(b), "\") to str"));
      }
      RETURN_IF_ERROR(r.CheckString(a.str().size() + b.str().size()));
      RETURN_IF_ERROR(
          r.Step(static_cast<int64_t>((a.str().size() + b.str().size()) / 64)));
      return Value::String(a.str() + b.str());
    }
    if (IsSeq(a)) {
      if (!IsSeq(b) || a.seq_kind() != b.seq_kind()) {
        return RenderError(absl::StrCat("can only concatenate ", TypeName(a),
                                        " (not \"", TypeName(b), "\") to ",
                                        TypeName(a)));
      }
      const auto& x = a.list().items;
      const auto& y = b.list().items;
      RETURN_IF_ERROR(r.CheckItems(x.size() + y.size()));
      RETURN_IF_ERROR(r.Step(static_cast<int64_t>((x.size() + y.size()) / 4)));
      std::vector<Value> out = x;
      out.insert(out.end(), y.begin(), y.end());
      return r.Checked(Value::List(std::move(out), a.seq_kind()));
    }
  }
  if (op == BinOp::kMul) {
    const bool a_seq = a.is_string() || IsSeq(a);
    const bool b_seq = b.is_string() || IsSeq(b);
    if (a_seq && b.is_integral()) return Repeat(r, a, b.int_value());
    if (b_seq && a.is_integral()) return Repeat(r, b, a.int_value());
    if (a_seq || b_seq) {
      return RenderError(
          absl::StrCat("can't multiply sequence by non-int of type '",
                       TypeName(a_seq ? b : a), "'"));
    }
  }
  return Unsupported(op, a, b);
}

absl::StatusOr<Value> Negate(const Value& v) {
  if (v.is_undefined()) return UndefinedError(v);
  if (v.is_integral()) {
    if (v.int_value() == INT64_MIN) return Overflow();
    return Value::Int(-v.int_value());
  }
  if (v.is_float()) return Value::Float(-v.float_value());
  return RenderError(
      absl::StrCat("bad operand type for unary -: '", TypeName(v), "'"));
}

absl::StatusOr<Value> UnaryPlus(const Value& v) {
  if (v.is_undefined()) return UndefinedError(v);
  if (v.is_integral()) return Value::Int(v.int_value());
  if (v.is_float()) return v;
  return RenderError(
      absl::StrCat("bad operand type for unary +: '", TypeName(v), "'"));
}

absl::StatusOr<bool> CompareOp(Renderer& r, CmpOp op, const Value& a,
                               const Value& b) {
  switch (op) {
    case CmpOp::kEq:
      return Equals(a, b);
    case CmpOp::kNe:
      return !Equals(a, b);
    case CmpOp::kIn:
      return Contains(r, b, a);
    case CmpOp::kNotIn: {
      ASSIGN_OR_RETURN(bool in, Contains(r, b, a));
      return !in;
    }
    default:
      return Order(op, a, b);
  }
}

absl::StatusOr<bool> Less(const Value& a, const Value& b) {
  return Order(CmpOp::kLt, a, b);
}

absl::Status CheckHashable(const Value& v) {
  if (v.is_dict() || (v.is_list() && v.seq_kind() != SeqKind::kTuple)) {
    return RenderError(absl::StrCat("unhashable type: '", TypeName(v), "'"));
  }
  if (v.is_list()) {
    for (const Value& item : v.list().items)
      RETURN_IF_ERROR(CheckHashable(item));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Contains(Renderer& r, const Value& container,
                              const Value& item) {
  switch (container.kind()) {
    case Kind::kUndefined:
      return false;
    case Kind::kString:
      if (!item.is_string()) {
        return RenderError(
            absl::StrCat("'in <string>' requires string as left operand, not ",
                         TypeName(item)));
      }
      RETURN_IF_ERROR(
          r.Step(static_cast<int64_t>(container.str().size() / 64)));
      return container.str().find(item.str()) != std::string::npos;
    case Kind::kList:
      RETURN_IF_ERROR(
          r.Step(static_cast<int64_t>(container.list().items.size())));
      for (const Value& v : container.list().items) {
        if (Equals(v, item)) return true;
      }
      return false;
    case Kind::kDict:
      RETURN_IF_ERROR(CheckHashable(item));
      return container.dict().Find(item) != nullptr;
    case Kind::kGenerator: {
      GeneratorData& g = container.generator();
      while (g.pos < g.items.size()) {
        if (Equals(g.items[g.pos++], item)) return true;
      }
      return false;
    }
    default:
      return RenderError(absl::StrCat("argument of type '", TypeName(container),
                                      "' is not iterable"));
  }
}

}  // namespace pdserve::jinja

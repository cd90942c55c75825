#include "common/model/quantized_checkpoint.h"

#include <cstring>
#include <fstream>
#include <iterator>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace pdserve {
namespace {

using Json = nlohmann::json;

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// The tensor `name`, checked for dtype (one of `dtypes`) and shape.
absl::StatusOr<const TensorInfo*> Tensor(const Checkpoint& ckpt,
                                         const std::string& name,
                                         std::vector<DType> dtypes,
                                         const std::vector<int64_t>& shape,
                                         absl::string_view why) {
  ASSIGN_OR_RETURN(const TensorInfo* t, ckpt.Find(name));
  bool dtype_ok = false;
  for (DType d : dtypes) dtype_ok |= t->dtype == d;
  if (!dtype_ok) {
    return absl::InvalidArgumentError(
        absl::StrCat(t->file, ": quantized tensor '", name, "' has dtype ",
                     DTypeName(t->dtype), ", expected ", DTypeName(dtypes[0]),
                     " (", why, ")"));
  }
  if (t->shape != shape) {
    return absl::InvalidArgumentError(
        absl::StrCat(t->file, ": quantized tensor '", name, "' has shape ",
                     ShapeString(t->shape), ", expected ", ShapeString(shape),
                     " (", why, ")"));
  }
  return t;
}

uint32_t Word(const TensorInfo* t, int64_t i) {
  uint32_t w;
  std::memcpy(&w, t->data + 4 * i, 4);
  return w;
}

}  // namespace

std::string CheckpointQuant::ToString() const {
  return absl::StrCat(method, "-", bits, "b-g", group_size,
                      sym ? "-sym" : "-asym", desc_act ? "-actorder" : "",
                      method == "gptq" && !zeros_minus_one ? "-v2" : "");
}

namespace {

// One quantization object (config.json's quantization_config, or a whole
// quantize_config.json / quant_config.json), `where` naming it in errors.
// `default_method` stands in for a missing quant_method (the side files of
// AutoGPTQ and AutoAWQ may omit it); empty: quant_method is required.
absl::StatusOr<CheckpointQuant> ParseQuantObject(
    const Json& qc, const std::string& default_method,
    const std::string& where) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", why));
  };
  if (!qc.is_object()) return bad("not a JSON object");
  CheckpointQuant q;
  if (qc.contains("quant_method") && qc["quant_method"].is_string()) {
    q.method = qc["quant_method"].get<std::string>();
  } else if (!default_method.empty() &&
             (!qc.contains("quant_method") || qc["quant_method"].is_null())) {
    q.method = default_method;
  } else {
    return bad("missing string 'quant_method'");
  }
  // Published files spell the method in either case ("GPTQ", "AWQ").
  q.method = absl::AsciiStrToLower(q.method);
  if (q.method != "gptq" && q.method != "awq") {
    return absl::UnimplementedError(
        absl::StrCat(where, ": quant_method '", q.method,
                     "' is not supported (supported: gptq, awq)"));
  }
  auto integer = [&](const char* key, int fallback, int* out) -> absl::Status {
    if (!qc.contains(key) || qc[key].is_null()) {
      *out = fallback;
      return absl::OkStatus();
    }
    if (!qc[key].is_number_integer()) {
      return bad(absl::StrCat("'", key, "' must be an integer"));
    }
    *out = qc[key].get<int>();
    return absl::OkStatus();
  };
  auto boolean = [&](const char* key, bool fallback,
                     bool* out) -> absl::Status {
    if (!qc.contains(key) || qc[key].is_null()) {
      *out = fallback;
      return absl::OkStatus();
    }
    if (!qc[key].is_boolean()) {
      return bad(absl::StrCat("'", key, "' must be a boolean"));
    }
    *out = qc[key].get<bool>();
    return absl::OkStatus();
  };
  const char* bits_key =
      q.method == "awq" && qc.contains("w_bit") ? "w_bit" : "bits";
  RETURN_IF_ERROR(integer(bits_key, 4, &q.bits));
  const char* group_key = q.method == "awq" && qc.contains("q_group_size")
                              ? "q_group_size"
                              : "group_size";
  RETURN_IF_ERROR(integer(group_key, 128, &q.group_size));
  if (q.group_size == 0 || q.group_size < -1) {
    return bad(
        absl::StrCat("group_size ", q.group_size, " (a positive size or -1)"));
  }
  if (q.method == "gptq") {
    if (q.bits != 4 && q.bits != 8) {
      return absl::UnimplementedError(absl::StrCat(
          where, ": GPTQ with ", q.bits, " bits is not supported (4 or 8)"));
    }
    RETURN_IF_ERROR(boolean("desc_act", false, &q.desc_act));
    RETURN_IF_ERROR(boolean("sym", true, &q.sym));
    std::string format = "gptq";
    if (qc.contains("checkpoint_format") && qc["checkpoint_format"].is_string())
      format = qc["checkpoint_format"].get<std::string>();
    if (format != "gptq" && format != "gptq_v2") {
      return absl::UnimplementedError(
          absl::StrCat(where, ": GPTQ checkpoint_format '", format,
                       "' is not supported (gptq, gptq_v2)"));
    }
    q.zeros_minus_one = format == "gptq";
  } else {
    if (q.bits != 4) {
      return absl::UnimplementedError(absl::StrCat(
          where, ": AWQ with ", q.bits, " bits is not supported (4)"));
    }
    std::string version = "gemm";
    if (qc.contains("version") && qc["version"].is_string()) {
      version = qc["version"].get<std::string>();
    }
    if (absl::AsciiStrToLower(version) != "gemm") {
      return absl::UnimplementedError(absl::StrCat(
          where, ": AWQ version '", version, "' is not supported (gemm)"));
    }
    bool zero_point = true;
    RETURN_IF_ERROR(boolean("zero_point", true, &zero_point));
    if (!zero_point) {
      return absl::UnimplementedError(
          absl::StrCat(where,
                       ": AWQ with zero_point false is not supported "
                       "(AutoAWQ's gemm format stores zero points)"));
    }
    q.sym = false;
    q.zeros_minus_one = false;
  }
  return q;
}

absl::StatusOr<Json> ParseJson(absl::string_view text,
                               absl::string_view source) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": invalid JSON: ", e.what()));
  }
}

}  // namespace

absl::StatusOr<std::optional<CheckpointQuant>> ParseCheckpointQuant(
    absl::string_view config_json, absl::string_view source) {
  ASSIGN_OR_RETURN(Json j, ParseJson(config_json, source));
  if (!j.is_object() || !j.contains("quantization_config") ||
      j["quantization_config"].is_null()) {
    return std::nullopt;
  }
  return ParseQuantObject(j["quantization_config"], "",
                          absl::StrCat(source, ": quantization_config"));
}

absl::StatusOr<std::optional<CheckpointQuant>> ReadCheckpointQuant(
    const std::string& dir, absl::string_view config_json) {
  ASSIGN_OR_RETURN(std::optional<CheckpointQuant> q,
                   ParseCheckpointQuant(config_json, dir + "/config.json"));
  if (q.has_value()) return q;
  // AutoGPTQ's and AutoAWQ's own exports describe the packing in a side
  // file instead (config.json's key came with transformers' integration).
  const std::pair<const char*, const char*> side_files[] = {
      {"quantize_config.json", "gptq"}, {"quant_config.json", "awq"}};
  for (const auto& [name, method] : side_files) {
    const std::string path = dir + "/" + name;
    std::ifstream in(path, std::ios::binary);
    if (!in) continue;
    const std::string text((std::istreambuf_iterator<char>(in)),
                           std::istreambuf_iterator<char>());
    ASSIGN_OR_RETURN(Json j, ParseJson(text, path));
    ASSIGN_OR_RETURN(CheckpointQuant side, ParseQuantObject(j, method, path));
    return side;
  }
  return std::nullopt;
}

absl::StatusOr<QuantizedWeight> LoadQuantizedLinear(const Checkpoint& ckpt,
                                                    const CheckpointQuant& q,
                                                    const std::string& prefix,
                                                    int64_t rows,
                                                    int64_t cols) {
  QuantizedWeight w;
  w.bits = q.bits;
  w.rows = rows;
  w.cols = cols;
  const int pack = 32 / q.bits;
  const uint32_t mask = (1u << q.bits) - 1u;
  const int64_t group = q.group_size == -1 ? cols : q.group_size;
  w.groups = (cols + group - 1) / group;
  const std::string why =
      absl::StrCat(q.method, " ", q.bits, "-bit, group_size ", q.group_size,
                   ", layer ", ShapeString({rows, cols}), " [out, in]");
  const bool awq = q.method == "awq";
  if (rows % pack != 0 || (!awq && cols % pack != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quantized layer '", prefix, "': ", ShapeString({rows, cols}),
        " does not pack into 32-bit words of ", pack, " values"));
  }
  ASSIGN_OR_RETURN(const TensorInfo* qweight,
                   Tensor(ckpt, prefix + ".qweight", {DType::kI32},
                          awq ? std::vector<int64_t>{cols, rows / pack}
                              : std::vector<int64_t>{cols / pack, rows},
                          why));
  ASSIGN_OR_RETURN(const TensorInfo* qzeros,
                   Tensor(ckpt, prefix + ".qzeros", {DType::kI32},
                          {w.groups, rows / pack}, why));
  ASSIGN_OR_RETURN(
      const TensorInfo* scales,
      Tensor(ckpt, prefix + ".scales", {DType::kF16, DType::kF32, DType::kBF16},
             {w.groups, rows}, why));
  // AWQ's packing order along `out`: nibble t holds column order[t].
  static constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  auto column_of = [&](int t) { return awq ? kAwqOrder[t] : t; };
  // Codes.
  w.codes.resize(rows * cols);
  if (awq) {
    for (int64_t k = 0; k < cols; ++k) {
      for (int64_t word = 0; word < rows / pack; ++word) {
        const uint32_t v = Word(qweight, k * (rows / pack) + word);
        for (int t = 0; t < pack; ++t) {
          const int64_t n = word * pack + column_of(t);
          w.codes[n * cols + k] =
              static_cast<uint8_t>((v >> (q.bits * t)) & mask);
        }
      }
    }
  } else {
    for (int64_t word = 0; word < cols / pack; ++word) {
      for (int64_t n = 0; n < rows; ++n) {
        const uint32_t v = Word(qweight, word * rows + n);
        for (int t = 0; t < pack; ++t) {
          w.codes[n * cols + word * pack + t] =
              static_cast<uint8_t>((v >> (q.bits * t)) & mask);
        }
      }
    }
  }
  // Zero points and scales.
  w.zeros.resize(w.groups * rows);
  for (int64_t g = 0; g < w.groups; ++g) {
    for (int64_t word = 0; word < rows / pack; ++word) {
      const uint32_t v = Word(qzeros, g * (rows / pack) + word);
      for (int t = 0; t < pack; ++t) {
        const int64_t n = word * pack + column_of(t);
        w.zeros[g * rows + n] =
            static_cast<int32_t>((v >> (q.bits * t)) & mask) +
            (q.zeros_minus_one ? 1 : 0);
      }
    }
  }
  w.scales.resize(w.groups * rows);
  ConvertToF32(scales->dtype, scales->data, w.groups * rows, w.scales.data());
  // Groups of the inputs.
  const std::string g_idx_name = prefix + ".g_idx";
  if (!awq && ckpt.Has(g_idx_name)) {
    ASSIGN_OR_RETURN(const TensorInfo* g_idx,
                     Tensor(ckpt, g_idx_name, {DType::kI32}, {cols}, why));
    w.g_idx.resize(cols);
    for (int64_t k = 0; k < cols; ++k) {
      const int32_t g = static_cast<int32_t>(Word(g_idx, k));
      if (g < 0 || g >= w.groups) {
        return absl::InvalidArgumentError(absl::StrCat(
            g_idx->file, ": quantized tensor '", g_idx_name, "' holds group ",
            g, " at input ", k, ", outside [0, ", w.groups, ")"));
      }
      w.g_idx[k] = g;
    }
  } else if (q.desc_act) {
    return absl::NotFoundError(absl::StrCat(
        ckpt.description(), ": act-order (desc_act) checkpoint without '",
        g_idx_name, "': the group of each input is unknown"));
  } else {
    w.g_idx.resize(cols);
    for (int64_t k = 0; k < cols; ++k) w.g_idx[k] = k / group;
  }
  return w;
}

}  // namespace pdserve

// Safetensors files: a memory-mapped reader that validates the header (8-byte
// little-endian length + JSON), offsets, shapes and dtypes, a checkpoint view
// over one file or a sharded model.safetensors.index.json, and a writer (for
// tests and tools). Readers are immutable after Open: thread-safe to read.
#ifndef PDSERVE_COMMON_MODEL_SAFETENSORS_H_
#define PDSERVE_COMMON_MODEL_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/dtype.h"

namespace pdserve {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const char* data = nullptr;  // into the mapping (may be unaligned)
  int64_t nbytes = 0;
  std::string file;  // for error messages
  int64_t num_elements() const;
};

class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(
      const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* Find(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  int64_t map_size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
};

// All tensors of a checkpoint directory (model.safetensors, or the shards
// named by model.safetensors.index.json).
class Checkpoint {
 public:
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(
      const std::string& dir);
  // NOT_FOUND naming the tensor and the checkpoint when absent.
  absl::StatusOr<const TensorInfo*> Find(const std::string& name) const;
  bool Has(const std::string& name) const;
  std::vector<const TensorInfo*> AllTensors() const;  // sorted by name
  const std::string& description() const { return description_; }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*> index_;
  std::string description_;
};

struct TensorToWrite {
  std::string name;
  std::string dtype;  // safetensors name: "F32", "BF16", "F16", "I64", ...
  std::vector<int64_t> shape;
  std::string bytes;
};
absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<TensorToWrite>& tensors);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_MODEL_SAFETENSORS_H_

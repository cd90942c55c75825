#include "common/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace pdserve {
namespace {

absl::StatusOr<DType> ParseFileDType(const std::string& name,
                                     const std::string& path,
                                     const std::string& tensor) {
  if (name == "F32") return DType::kF32;
  if (name == "BF16") return DType::kBF16;
  if (name == "F16") return DType::kF16;
  if (name == "I32") return DType::kI32;
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": tensor '", tensor, "' has unsupported dtype ", name,
                   " (supported: F32, F16, BF16, I32)"));
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

int64_t TensorInfo::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(
    const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat(path, ": fstat failed"));
  }
  const int64_t size = st.st_size;
  if (size < 8) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat(
        path, ": truncated safetensors file (", size, " bytes, no header)"));
  }
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) {
    return absl::InternalError(absl::StrCat(path, ": mmap failed"));
  }
  auto file = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  file->path_ = path;
  file->map_ = map;
  file->map_size_ = size;
  const char* base = static_cast<const char*>(map);
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) {
    header_len |= static_cast<uint64_t>(static_cast<uint8_t>(base[i]))
                  << (8 * i);
  }
  if (header_len > static_cast<uint64_t>(size - 8)) {
    return absl::DataLossError(absl::StrCat(
        path, ": safetensors header length ", header_len,
        " exceeds the file size (", size, " bytes): truncated or corrupt"));
  }
  const int64_t data_start = 8 + static_cast<int64_t>(header_len);
  const int64_t data_size = size - data_start;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(base + 8, base + data_start);
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat(
        path, ": corrupt safetensors header (invalid JSON): ", e.what()));
  }
  if (!header.is_object()) {
    return absl::DataLossError(
        absl::StrCat(path, ": corrupt safetensors header (not an object)"));
  }
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    auto bad = [&](const std::string& what) {
      return absl::DataLossError(
          absl::StrCat(path, ": corrupt safetensors header for tensor '", name,
                       "': ", what));
    };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets") || !v["dtype"].is_string() ||
        !v["shape"].is_array() || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2) {
      return bad("expected {dtype, shape, data_offsets}");
    }
    TensorInfo info;
    info.name = name;
    info.file = path;
    ASSIGN_OR_RETURN(info.dtype,
                     ParseFileDType(v["dtype"].get<std::string>(), path, name));
    for (const auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        return bad("shape entries must be non-negative integers");
      }
      info.shape.push_back(d.get<int64_t>());
    }
    const auto& off = v["data_offsets"];
    if (!off[0].is_number_unsigned() && !off[0].is_number_integer()) {
      return bad("data_offsets must be integers");
    }
    if (!off[1].is_number_unsigned() && !off[1].is_number_integer()) {
      return bad("data_offsets must be integers");
    }
    const int64_t begin = off[0].get<int64_t>();
    const int64_t end = off[1].get<int64_t>();
    if (begin < 0 || end < begin) return bad("data_offsets out of order");
    if (end > data_size) {
      return absl::DataLossError(
          absl::StrCat(path, ": tensor '", name, "' data_offsets [", begin,
                       ", ", end, ") go past the end of the data (", data_size,
                       " bytes): truncated file"));
    }
    info.nbytes = end - begin;
    if (info.nbytes != info.num_elements() * DTypeSize(info.dtype)) {
      return bad(absl::StrCat("byte size ", info.nbytes,
                              " does not match shape ", ShapeString(info.shape),
                              " of ", DTypeName(info.dtype)));
    }
    info.data = base + data_start + begin;
    file->tensors_.emplace(name, std::move(info));
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) munmap(map_, map_size_);
}

const TensorInfo* SafetensorsFile::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(
    const std::string& dir) {
  auto ckpt = std::make_unique<Checkpoint>();
  const std::string single = dir + "/model.safetensors";
  const std::string index_path = dir + "/model.safetensors.index.json";
  struct stat st;
  if (stat(single.c_str(), &st) == 0) {
    ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(single));
    ckpt->files_.push_back(std::move(file));
    ckpt->description_ = single;
  } else if (stat(index_path.c_str(), &st) == 0) {
    std::ifstream in(index_path);
    std::stringstream ss;
    ss << in.rdbuf();
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(ss.str());
    } catch (const nlohmann::json::exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": invalid JSON: ", e.what()));
    }
    if (!index.is_object() || !index.contains("weight_map") ||
        !index["weight_map"].is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": missing object 'weight_map'"));
    }
    std::set<std::string> shards;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end();
         ++it) {
      if (!it.value().is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(
            index_path, ": weight_map entry '", it.key(), "' is not a string"));
      }
      shards.insert(it.value().get<std::string>());
    }
    for (const std::string& shard : shards) {
      if (shard.find('/') != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": shard name '", shard, "' has a '/'"));
      }
      auto file = SafetensorsFile::Open(dir + "/" + shard);
      if (!file.ok()) {
        return absl::Status(file.status().code(),
                            absl::StrCat("shard listed in ", index_path, ": ",
                                         file.status().message()));
      }
      ckpt->files_.push_back(std::move(*file));
    }
    ckpt->description_ = index_path;
  } else {
    return absl::NotFoundError(absl::StrCat(
        dir, ": no model.safetensors nor model.safetensors.index.json"));
  }
  for (const auto& file : ckpt->files_) {
    for (const auto& [name, info] : file->tensors()) {
      if (!ckpt->index_.emplace(name, &info).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            file->path(), ": tensor '", name, "' appears in two shards"));
      }
    }
  }
  return ckpt;
}

absl::StatusOr<const TensorInfo*> Checkpoint::Find(
    const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::NotFoundError(
        absl::StrCat(description_, ": missing tensor '", name, "'"));
  }
  return it->second;
}

bool Checkpoint::Has(const std::string& name) const {
  return index_.count(name) > 0;
}

std::vector<const TensorInfo*> Checkpoint::AllTensors() const {
  std::vector<const TensorInfo*> out;
  for (const auto& [name, info] : index_) out.push_back(info);
  return out;
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<TensorToWrite>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  int64_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {
        {"dtype", t.dtype},
        {"shape", t.shape},
        {"data_offsets",
         {offset, offset + static_cast<int64_t>(t.bytes.size())}}};
    offset += t.bytes.size();
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');
  std::ofstream out(path, std::ios::binary);
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  uint64_t len = h.size();
  char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<char>(len >> (8 * i));
  out.write(len_bytes, 8);
  out.write(h.data(), h.size());
  for (const auto& t : tensors) out.write(t.bytes.data(), t.bytes.size());
  if (!out) return absl::InternalError(absl::StrCat("error writing ", path));
  return absl::OkStatus();
}

}  // namespace pdserve

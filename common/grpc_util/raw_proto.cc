#include "common/grpc_util/raw_proto.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/unknown_field_set.h"

namespace pdserve {

namespace pb = ::google::protobuf;

int64_t InvalidUtf8Offset(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int len;
    uint32_t min;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      min = 0x10000;
    } else {
      return static_cast<int64_t>(i);
    }
    if (i + len > s.size()) return static_cast<int64_t>(i);
    uint32_t cp = c & (0xFF >> (len + 1));
    for (int k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return static_cast<int64_t>(i);
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return static_cast<int64_t>(i);
    }
    i += len;
  }
  return -1;
}

namespace {

// Finds the first string field with invalid UTF-8 in `bytes` read as
// `type`, walking nested messages; "" when there is none.
std::string FindInvalidUtf8(const std::string& bytes,
                            const pb::Descriptor* type,
                            const std::string& prefix) {
  pb::UnknownFieldSet fields;
  if (!fields.ParseFromString(bytes)) return "";
  for (int i = 0; i < fields.field_count(); ++i) {
    const pb::UnknownField& f = fields.field(i);
    if (f.type() != pb::UnknownField::TYPE_LENGTH_DELIMITED) continue;
    const pb::FieldDescriptor* fd = type->FindFieldByNumber(f.number());
    if (fd == nullptr) continue;
    const std::string name = prefix + fd->name();
    if (fd->type() == pb::FieldDescriptor::TYPE_STRING) {
      const int64_t at = InvalidUtf8Offset(f.length_delimited());
      if (at >= 0) {
        return absl::StrCat("field '", name, "' is not valid UTF-8 (byte ", at,
                            " of its value); strings must be UTF-8");
      }
    } else if (fd->type() == pb::FieldDescriptor::TYPE_MESSAGE) {
      std::string inner =
          FindInvalidUtf8(f.length_delimited(), fd->message_type(), name + ".");
      if (!inner.empty()) return inner;
    }
  }
  return "";
}

}  // namespace

absl::Status ParseProtoBytes(const std::string& bytes, pb::Message* message) {
  if (message->ParseFromString(bytes)) return absl::OkStatus();
  std::string why = FindInvalidUtf8(bytes, message->GetDescriptor(), "");
  if (why.empty()) {
    why = absl::StrCat("the request is not a valid ",
                       message->GetDescriptor()->full_name(), " message");
  }
  return absl::InvalidArgumentError(why);
}

absl::Status ParseRawProto(const grpc::ByteBuffer& buffer,
                           pb::Message* message) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) {
    return absl::InvalidArgumentError("unreadable request");
  }
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return ParseProtoBytes(bytes, message);
}

grpc::ByteBuffer SerializeToByteBuffer(const pb::Message& m) {
  const std::string bytes = m.SerializeAsString();
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace pdserve

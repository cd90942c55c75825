// Parsing and serializing protobuf messages from and to gRPC's raw
// ByteBuffers, for services that take requests as bytes so that a malformed
// request gets a clear INVALID_ARGUMENT instead of gRPC's generic parse
// failure. Above all: a string field holding invalid UTF-8 (which protobuf
// refuses to parse) is named, with the offset of the bad byte. Stateless:
// thread-safe.
#ifndef PDSERVE_COMMON_GRPC_UTIL_RAW_PROTO_H_
#define PDSERVE_COMMON_GRPC_UTIL_RAW_PROTO_H_

#include <string>

#include "absl/status/status.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"

namespace pdserve {

// OK, or INVALID_ARGUMENT: "field 'text' is not valid UTF-8 (byte 3 of the
// value)" / "the request is not a valid <type> message".
absl::Status ParseRawProto(const grpc::ByteBuffer& buffer,
                           google::protobuf::Message* message);
absl::Status ParseProtoBytes(const std::string& bytes,
                             google::protobuf::Message* message);

grpc::ByteBuffer SerializeToByteBuffer(const google::protobuf::Message& m);

// Where `s` first stops being valid UTF-8, or -1 when it is valid.
int64_t InvalidUtf8Offset(const std::string& s);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_GRPC_UTIL_RAW_PROTO_H_

// A UCX peer in a process of its own, for tests that kill it: connects to
// the worker whose packed address is argv[1] (hex) the way a prefill worker
// on the same host does (no peer-failure mode, so UCX may use shared
// memory), sends two 4 MiB rendezvous messages tagged argv[2] and argv[2]+2
// and then a small eager one tagged argv[2]+1 (UCX keeps a sender's order,
// so whoever received that one has both announcements) and waits to be
// killed.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "common/transport/ucx_worker.h"

int main(int argc, char** argv) {
  using pdserve::transport::UcxWorker;
  uint64_t tag = 0;
  if (argc != 3 || !absl::SimpleAtoi(argv[2], &tag)) {
    std::fprintf(stderr, "usage: %s PEER_ADDRESS_HEX TAG\n", argv[0]);
    return 2;
  }
  const std::string address = absl::HexStringToBytes(argv[1]);
  auto worker = UcxWorker::Create();
  if (!worker.ok()) {
    std::fprintf(stderr, "%s\n", worker.status().ToString().c_str());
    return 1;
  }
  auto conn = (*worker)->Connect(address, /*peer_errors=*/false);
  auto region = (*worker)->Allocate(4 << 20);
  if (!conn.ok() || !region.ok()) {
    std::fprintf(stderr, "connect/allocate failed\n");
    return 1;
  }
  auto first = (*worker)->Send(**conn, **region, 0, 4 << 20, tag);
  auto second = (*worker)->Send(**conn, **region, 0, 4 << 20, tag + 2);
  auto eager = (*worker)->Send(**conn, **region, 0, 64, tag + 1);
  if (!first.ok() || !second.ok() || !eager.ok()) {
    std::fprintf(stderr, "send failed\n");
    return 1;
  }
  while (true) pause();
}

#include "common/util/version.h"

#include <cstdio>

#include "tools/subcommand.h"

namespace pdserve {
namespace {

int RunVersion(const std::vector<std::string>&) {
  std::printf("pdserve %s\n", kPdserveVersion);
  return 0;
}

PDSERVE_SUBCOMMAND("version", "print the version", "pdserve version", {},
                   RunVersion);

}  // namespace
}  // namespace pdserve

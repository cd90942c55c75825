#include "common/util/malloc_tuning.h"

#include <malloc.h>

namespace pdserve {

void TuneMallocForLargeBuffers() {
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace pdserve

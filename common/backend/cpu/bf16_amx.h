// The AMX-BF16 kernel of MatMul (packed_matrix.h), run for --dtype=bf16 only
// when asked (PDSERVE_BF16_KERNEL=amx): tiles (tdpbf16ps) multiply 16 rows x
// 16 columns x 16 pairs of k per instruction, straight from the bf16
// panels (their pair-major layout is AMX's B operand). Its sums are AMX's
// own (not vdpbf16ps' definition), so the bits depend on the CPU; they are
// still batch-invariant: every product of the process, one row or many,
// runs through it with the same k order. Internal to the CPU backend;
// stateless, thread-safe (each calling thread configures its own tiles).
#ifndef PDSERVE_COMMON_BACKEND_CPU_BF16_AMX_H_
#define PDSERVE_COMMON_BACKEND_CPU_BF16_AMX_H_

#include <cstdint>

namespace pdserve {

// The activation buffer's shape for the kernel: each row's pairs
// zero-filled up to a multiple of kAmxBf16PairStep (a tile's pairs).
inline constexpr int kAmxBf16PairStep = 16;

// True when the CPU has AMX-BF16 and the kernel granted this process the
// tile state (asked once).
bool CpuHasAmxBf16();

// Holds the calling thread's tile configuration for Bf16PanelAmx (loaded
// as the calls need it); releases it when destroyed. Hold one around calls
// of Bf16PanelAmx on that thread, with no other AMX code between them.
class AmxBf16TileScope {
 public:
  AmxBf16TileScope();
  ~AmxBf16TileScope();
  AmxBf16TileScope(const AmxBf16TileScope&) = delete;
  AmxBf16TileScope& operator=(const AmxBf16TileScope&) = delete;
};

// y[0:M)[0:valid) = x . panel for one panel of 64 output columns: x as bf16
// pairs (ldx uint32 per row, shaped as above), the panel K pairs of 64
// columns (256 bytes per pair). Per element: zero, then one tdpbf16ps per
// 16 pairs in increasing k.
void Bf16PanelAmx(const uint32_t* x, int64_t M, int64_t ldx, const char* panel,
                  int64_t K, int valid, float* y, int64_t ldy);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_BACKEND_CPU_BF16_AMX_H_

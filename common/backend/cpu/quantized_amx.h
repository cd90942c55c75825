// The AMX-INT8 kernel of QuantMatMul (quantized_matrix.h): the same integer
// block sums and the same float steps as the VNNI kernel, so the bits are
// equal; tiles (tdpbsud) compute 16 rows x 16 columns x 32 k per
// instruction. Internal to the CPU backend; stateless, thread-safe (each
// calling thread configures its own tiles).
#ifndef PDSERVE_COMMON_BACKEND_CPU_QUANTIZED_AMX_H_
#define PDSERVE_COMMON_BACKEND_CPU_QUANTIZED_AMX_H_

#include <immintrin.h>

#include <cstdint>

namespace pdserve {

// One panel of 64 output columns of a quantized matrix, with the activation
// rows it multiplies (quantized in blocks of 32 k, see quantized_matrix.h).
struct QuantPanelArgs {
  const int8_t* xq;     // codes of the rows, ldq bytes apart
  const float* xs;      // per-block scales, ldb apart
  const int32_t* xsum;  // per-block code sums, ldb apart
  int64_t ldq, ldb;
  const char* panel;
  int64_t groups, blocks_per_group, code_bytes, group_bytes;
  float* y;  // output rows, ldy apart
  int64_t ldy;
  const __mmask16* masks;  // valid columns of each 16-column quarter
};

// Rows per AMX row group: the activation buffer must hold codes (zeros) up
// to a multiple of this many rows past the last real row.
inline constexpr int kAmxRowGroup = 32;

// The operand of ldtilecfg (palette 1): rows and bytes per row of each
// tile register. Shared by the AMX kernels (this one, bf16_amx.h).
struct AmxTileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Loads `config` on the calling thread.
void LoadAmxTileConfig(const AmxTileConfig& config);

// True when the kernel granted this process AMX's tile state (asked once;
// false where the CPU has no AMX or PDSERVE_DISABLE_AMX is set).
bool AmxTileStateGranted();

// True when the CPU has AMX-INT8 (and AVX512-VNNI) and the tile state is
// granted.
bool CpuHasAmxInt8();

// Loads the tile configuration on the calling thread; releases it when
// destroyed. Hold one around calls of QuantPanelAmx on that thread.
class AmxTileScope {
 public:
  AmxTileScope();
  ~AmxTileScope();
  AmxTileScope(const AmxTileScope&) = delete;
  AmxTileScope& operator=(const AmxTileScope&) = delete;
};

// y[0:M)[panel columns] = the panel's product for M rows (M >= 1), as
// QuantMatMul defines it. bits 8 or 4; asym: per-column zero points.
void QuantPanelAmx(const QuantPanelArgs& a, int64_t M, int bits, bool asym);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_BACKEND_CPU_QUANTIZED_AMX_H_

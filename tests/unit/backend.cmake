pdserve_add_test(backend_test SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/backend_test.cc
  LIBS pdserve_backend LABELS engine)
pdserve_add_test(attention_test
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/attention_test.cc
  LIBS pdserve_backend LABELS engine)
# The same matmul checks on the AVX-512F emulation of vdpbf16ps (CPUs
# without AVX512-BF16): bit-identical by construction.
if(TARGET backend_test)
  add_test(NAME backend_test_emulated_bf16 COMMAND backend_test
    --gtest_filter=MatMul.*)
  set_tests_properties(backend_test_emulated_bf16 PROPERTIES
    ENVIRONMENT PDSERVE_DISABLE_AVX512_BF16=1 LABELS engine
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
endif()
# The same checks with vdpbf16ps forced where the CPU has it (by default the
# faster of it and its emulation runs, timed at first use).
if(TARGET backend_test)
  add_test(NAME backend_test_vdpbf16ps COMMAND backend_test
    --gtest_filter=MatMul.*)
  set_tests_properties(backend_test_vdpbf16ps PROPERTIES
    ENVIRONMENT PDSERVE_BF16_KERNEL=vdpbf16ps LABELS engine
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
endif()
# The quantized matmul on its scalar fallback (CPUs without AVX512-VNNI):
# checked against the same documented arithmetic, bit for bit.
if(TARGET backend_test)
  add_test(NAME backend_test_scalar_vnni COMMAND backend_test
    --gtest_filter=QuantMatMul.*)
  set_tests_properties(backend_test_scalar_vnni PROPERTIES
    ENVIRONMENT PDSERVE_DISABLE_AVX512_VNNI=1 LABELS engine
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
endif()
# The matmul on CPUs without AVX-512: the AVX2 kernel, and the scalar code
# of CPUs without AVX2 either; both exactly the documented arithmetic.
if(TARGET backend_test)
  add_test(NAME backend_test_avx2 COMMAND backend_test --gtest_filter=MatMul.*)
  set_tests_properties(backend_test_avx2 PROPERTIES
    ENVIRONMENT PDSERVE_DISABLE_AVX512=1 LABELS engine
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  add_test(NAME backend_test_scalar COMMAND backend_test --gtest_filter=MatMul.*)
  set_tests_properties(backend_test_scalar PROPERTIES
    ENVIRONMENT "PDSERVE_DISABLE_AVX512=1;PDSERVE_DISABLE_AVX2=1" LABELS engine
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
endif()
# Attention on its AVX2 path (CPUs without AVX-512; where the CPU has no AVX2,
# the scalar one): the same bits.
if(TARGET attention_test)
  add_test(NAME attention_test_portable COMMAND attention_test)
  set_tests_properties(attention_test_portable PROPERTIES
    ENVIRONMENT PDSERVE_DISABLE_AVX512=1 LABELS engine
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
endif()
# Attention on its scalar path (CPUs without AVX2 either): the same bits.
if(TARGET attention_test)
  add_test(NAME attention_test_scalar COMMAND attention_test)
  set_tests_properties(attention_test_scalar PROPERTIES
    ENVIRONMENT "PDSERVE_DISABLE_AVX512=1;PDSERVE_DISABLE_AVX2=1" LABELS engine
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
endif()
# The bf16 matmul on AMX tiles (PDSERVE_BF16_KERNEL=amx, opt-in): not
# vdpbf16ps' definition (that check is left out), but batch-invariant and
# within the same tolerance of the reference. Reports itself skipped on a
# CPU without AMX-BF16.
if(TARGET backend_test)
  add_test(NAME backend_test_amx_bf16 COMMAND backend_test
    --gtest_filter=MatMul.*:-MatMul.Bf16IsExactlyThePairDotDefinition)
  set_tests_properties(backend_test_amx_bf16 PROPERTIES
    ENVIRONMENT PDSERVE_BF16_KERNEL=amx LABELS engine
    SKIP_REGULAR_EXPRESSION "AMX kernel is not exercised"
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
endif()

// What the UCX transport tests share: a UCX worker with a given UCX_TLS.
#ifndef PDSERVE_TESTS_UNIT_UCX_TEST_UTIL_H_
#define PDSERVE_TESTS_UNIT_UCX_TEST_UTIL_H_

#include <stdlib.h>

#include <memory>
#include <string>

#include "common/transport/ucx_worker.h"
#include "gtest/gtest.h"

namespace pdserve::transport {

// A UCX worker started with UCX_TLS=`tls` ("" = UCX's default).
inline std::unique_ptr<UcxWorker> WorkerWithTls(const std::string& tls) {
  const char* old = getenv("UCX_TLS");
  const std::string saved = old != nullptr ? old : "";
  if (tls.empty()) {
    unsetenv("UCX_TLS");
  } else {
    setenv("UCX_TLS", tls.c_str(), 1);
  }
  auto w = UcxWorker::Create();
  if (old != nullptr) {
    setenv("UCX_TLS", saved.c_str(), 1);
  } else {
    unsetenv("UCX_TLS");
  }
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? *std::move(w) : nullptr;
}

}  // namespace pdserve::transport

#endif  // PDSERVE_TESTS_UNIT_UCX_TEST_UTIL_H_

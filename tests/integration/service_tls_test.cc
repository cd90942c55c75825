// TLS on the router's public port and mutual TLS between router, prefill and
// decode workers, with certificates generated here by openssl.
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util/grpc_util.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"

namespace pdserve::testing {
namespace {

// A CA, a node certificate (server + client auth, 127.0.0.1/localhost) signed
// by it, and a rogue CA + client certificate.
class Certs {
 public:
  absl::Status Generate() {
    const std::string d = dir_.path();
    const std::string ext = d + "/ext.cnf";
    std::ofstream(ext) << "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                          "extendedKeyUsage=serverAuth,clientAuth\n";
    for (const char* ca : {"ca", "rogue_ca"}) {
      if (!Run(absl::StrCat(
              "openssl req -x509 -newkey rsa:2048 -nodes -keyout ", d, "/", ca,
              ".key -out ", d, "/", ca, ".pem -days 2 -subj /CN=", ca))) {
        return absl::InternalError("openssl: CA");
      }
    }
    for (auto [name, ca] :
         {std::pair{"node", "ca"}, std::pair{"rogue", "rogue_ca"}}) {
      if (!Run(absl::StrCat("openssl req -newkey rsa:2048 -nodes -keyout ", d,
                            "/", name, ".key -out ", d, "/", name,
                            ".csr -subj /CN=localhost")) ||
          !Run(absl::StrCat("openssl x509 -req -in ", d, "/", name, ".csr -CA ",
                            d, "/", ca, ".pem -CAkey ", d, "/", ca,
                            ".key -CAcreateserial -out ", d, "/", name,
                            ".pem -days 2 -extfile ", ext))) {
        return absl::InternalError("openssl: certificate");
      }
    }
    return absl::OkStatus();
  }
  std::string path(const std::string& file) const {
    return dir_.path() + "/" + file;
  }

 private:
  static bool Run(const std::string& cmd) {
    return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0;
  }
  TempDir dir_;
};

TEST(TlsTest, TlsRouterAndMutualTlsWorkers) {
  Certs certs;
  ASSERT_TRUE(certs.Generate().ok());
  TlsFiles node{certs.path("ca.pem"), certs.path("node.pem"),
                certs.path("node.key")};
  ClusterOptions o;
  o.common_flags = {"--internal_ca=" + node.ca, "--internal_cert=" + node.cert,
                    "--internal_key=" + node.key};
  o.router_flags = {"--tls_cert=" + node.cert, "--tls_key=" + node.key};
  o.router_creds = *MakeChannelCredentials(TlsFiles{node.ca, "", ""});
  o.internal_creds = *MakeChannelCredentials(node);
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;

  // A client streams over TLS (the whole path is mTLS inside).
  const ReferenceCase ref = LoadReferenceCases()[0];
  auto r =
      RunGenerate(c.router(), IdsRequest(ref.prompt_ids, ref.max_new_tokens),
                  absl::Seconds(30));
  ASSERT_TRUE(r.ok()) << r.status() << c.Logs();
  EXPECT_EQ(r->output_ids, ref.output_ids);

  // A plaintext client cannot talk to the TLS router.
  {
    auto plain = v1::Generation::NewStub(MakeChannel(
        c.router_process().address(), grpc::InsecureChannelCredentials()));
    auto bad =
        RunGenerate(*plain, IdsRequest(ref.prompt_ids, 4), absl::Seconds(5));
    EXPECT_FALSE(bad.ok());
  }

  // Workers refuse peers without a valid client certificate.
  auto status_with = [&](const RoleProcess& worker,
                         std::shared_ptr<grpc::ChannelCredentials> creds) {
    auto stub = pb::Worker::NewStub(MakeChannel(worker.address(), creds));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    pb::WorkerStatusResponse resp;
    return stub->Status(&ctx, pb::WorkerStatusRequest(), &resp);
  };
  for (RoleProcess* worker : {&c.prefill(0), &c.decode(0)}) {
    SCOPED_TRACE(worker->name);
    EXPECT_TRUE(status_with(*worker, *MakeChannelCredentials(node)).ok());
    EXPECT_FALSE(status_with(*worker, grpc::InsecureChannelCredentials()).ok())
        << "plaintext peer accepted";
    EXPECT_FALSE(
        status_with(*worker, *MakeChannelCredentials(TlsFiles{node.ca, "", ""}))
            .ok())
        << "peer without a client certificate accepted";
    TlsFiles rogue{node.ca, certs.path("rogue.pem"), certs.path("rogue.key")};
    EXPECT_FALSE(status_with(*worker, *MakeChannelCredentials(rogue)).ok())
        << "peer with a certificate from another CA accepted";
  }
}

}  // namespace
}  // namespace pdserve::testing

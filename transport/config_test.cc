#include "cohort/transport/config.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cohort/core/error.h"
#include "cohort/transport/security/frame_cipher.h"

namespace tp = cohort::transport;

namespace {

cohort::Config load(std::vector<std::string> overrides) {
  cohort::ConfigSchema schema;
  tp::add_transport_config(schema, /*listener=*/true);
  return cohort::Config::load(schema, std::nullopt, overrides);
}

}  // namespace

TEST_CASE("add_transport_config declares every tls.* and transport.* key, with help") {
  cohort::ConfigSchema schema;
  tp::add_transport_config(schema, /*listener=*/true);
  for (const char* key : {"tls.insecure", "tls.ca_file", "tls.cert_file", "tls.key_file",
                          "tls.coordinator_name", "transport.chunk_kib", "transport.receive_queue",
                          "transport.aead"}) {
    CAPTURE(key);
    const cohort::OptionSpec* spec = schema.find(key);
    REQUIRE(spec != nullptr);
    CHECK(!spec->help.empty());
  }
  CHECK(schema.find("tls.key_file")->secret);
  // A program that does not listen for many peers has no receive queue to set.
  cohort::ConfigSchema connector;
  tp::add_transport_config(connector, /*listener=*/false);
  CHECK(connector.find("transport.receive_queue") == nullptr);
  CHECK(connector.find("transport.aead") != nullptr);
  CHECK(schema.help_text().find("transport.aead") != std::string::npos);
}

TEST_CASE("endpoint_options_from fills the endpoint options from the keys") {
  const auto o = tp::endpoint_options_from(
      load({"tls.ca_file=ca.pem", "tls.cert_file=c.pem", "tls.key_file=k.pem",
            "transport.chunk_kib=256", "transport.aead=openssl"}),
      "client-7");
  CHECK(o.node_id == "client-7");
  CHECK_FALSE(o.security.insecure);
  CHECK(o.security.ca_file == "ca.pem");
  CHECK(o.security.cert_file == "c.pem");
  CHECK(o.security.key_file == "k.pem");
  CHECK(o.security.expected_peer.empty());
  CHECK(o.security.aead == tp::Aead::kOpenSsl);
  CHECK(o.chunk_bytes == 256 * 1024);
  CHECK(o.receive_queue == tp::EndpointOptions{}.receive_queue);  // the listener's to apply
  CHECK(tp::endpoint_options_from(load({"tls.insecure=true"}), "a").security.insecure);
  CHECK(tp::endpoint_options_from(load({}), "a").security.aead == tp::Aead::kAuto);
}

TEST_CASE("bad transport values are refused at start-up, naming the key") {
  CHECK_THROWS_WITH_AS(tp::endpoint_options_from(load({"transport.aead=aesni"}), "a"),
                       "transport.aead must be auto, ipsec-mb or openssl, got 'aesni'",
                       cohort::ConfigError);
  CHECK_THROWS_WITH_AS(tp::endpoint_options_from(load({"transport.chunk_kib=1"}), "a"),
                       doctest::Contains("transport.chunk_kib"), cohort::ConfigError);
  // ipsec-mb where it cannot run (a build without it, or a CPU without AES-NI) is refused.
  const auto best = tp::security::FrameCipher::backend();
  const auto config = load({"transport.aead=ipsec-mb"});
  if (best.starts_with("ipsec-mb")) {
    CHECK(tp::endpoint_options_from(config, "a").security.aead == tp::Aead::kIpsecMb);
  } else {
    CHECK_THROWS_WITH_AS(tp::endpoint_options_from(config, "a"),
                         doctest::Contains("transport.aead = ipsec-mb"), cohort::ConfigError);
  }
}

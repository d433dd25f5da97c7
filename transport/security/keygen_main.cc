// cohort-keygen: creates a CA and node certificates for Cohort's mutual TLS.
//
//   cohort-keygen ca --out DIR [--cn NAME] [--force]
//   cohort-keygen node --ca DIR --name NAME --out DIR
//
// Exit status 0 on success, 1 with one line on stderr on any error.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <string>

#include "cohort/core/error.h"
#include "cohort/transport/security/keygen.h"

namespace {

namespace sec = cohort::transport::security;

int run(int argc, char** argv) {
  CLI::App app(
      "Creates the key material for Cohort's mutual TLS: a certificate authority (CA), and node "
      "certificates signed by it whose common name is the node id. Keys are EC P-256, "
      "certificates are valid for 10 years, private keys are written unencrypted with mode 0600.",
      "cohort-keygen");
  app.require_subcommand(0, 1);
  app.footer(
      "Example:\n  cohort-keygen ca --out pki\n  cohort-keygen node --ca pki --name shard-0 --out "
      "pki/nodes\nExit status: 0 on success, 1 with a one-line error on stderr.");

  std::string ca_out;
  std::string ca_cn = "cohort-ca";
  bool force = false;
  CLI::App* ca =
      app.add_subcommand("ca", "Create a CA: writes ca.pem and ca.key (mode 0600) into --out");
  ca->add_option("--out", ca_out, "Directory to write into (created if missing)")
      ->type_name("DIR")
      ->required();
  ca->add_option("--cn", ca_cn, "Common name of the CA certificate")
      ->type_name("NAME")
      ->capture_default_str();
  ca->add_flag("--force", force,
               "Replace an existing ca.key (certificates it signed stop verifying)");

  std::string node_ca, node_name, node_out;
  CLI::App* node = app.add_subcommand(
      "node",
      "Create a node certificate signed by the CA in --ca: writes NAME.pem and NAME.key "
      "(mode 0600) into --out, replacing existing ones");
  node->add_option("--ca", node_ca, "Directory holding ca.pem and ca.key")
      ->type_name("DIR")
      ->required();
  node->add_option("--name", node_name,
                   "Node id, also the certificate's CN and DNS name: 1-64 characters from "
                   "A-Z a-z 0-9 . _ -")
      ->type_name("NAME")
      ->required();
  node->add_option("--out", node_out, "Directory to write into (created if missing)")
      ->type_name("DIR")
      ->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::cerr << "cohort-keygen: error: " << e.what() << " (see --help)\n";
    return 1;
  }

  if (!ca->parsed() && !node->parsed()) {
    std::cerr << "cohort-keygen: error: expected a subcommand, ca or node (see --help)\n";
    return 1;
  }
  if (ca->parsed()) {
    sec::generate_ca(ca_out, ca_cn, force ? sec::Overwrite::kYes : sec::Overwrite::kNo);
    const std::filesystem::path dir(ca_out);
    std::cout << "wrote " << (dir / "ca.pem").string() << " and " << (dir / "ca.key").string()
              << '\n';
  } else {
    const sec::TlsFiles files = sec::generate_node(node_ca, node_name, node_out);
    std::cout << "wrote " << files.cert_file << " and " << files.key_file << '\n';
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "cohort-keygen: error: " << e.what() << '\n';
    return 1;
  }
}

// The public Aead choice (endpoint.h) as transport/security's AeadBackend (private to transport/).
#pragma once

#include "cohort/transport/endpoint.h"
#include "cohort/transport/security/frame_cipher.h"

namespace cohort::transport::detail {

security::AeadBackend aead_backend(Aead aead);

}  // namespace cohort::transport::detail

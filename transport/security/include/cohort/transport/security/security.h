// Everything transport/security offers: TLS handshake, frame sealing, anti-replay, key generation.
#pragma once

#include "cohort/transport/security/frame_cipher.h"
#include "cohort/transport/security/keygen.h"
#include "cohort/transport/security/replay_window.h"
#include "cohort/transport/security/tls.h"

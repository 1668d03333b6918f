#pragma once
// kshard's version, for logs and checkpoint manifests.
namespace kshard {
const char* version() noexcept;
}

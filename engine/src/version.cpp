#include "kshard/engine/version.hpp"
namespace kshard {
const char* version() noexcept { return "0.1.0"; }
}

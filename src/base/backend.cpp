#include <torchattn/backend.h>

#include <c10/util/Exception.h>

#include <ostream>

namespace torchattn {

std::string_view to_string(Backend backend) {
  switch (backend) {
    case Backend::Auto:
      return "auto";
    case Backend::Reference:
      return "reference";
    case Backend::SDPA:
      return "sdpa";
  }
  TORCH_CHECK(false, "torchattn::Backend: unknown value ", static_cast<int>(backend));
}

Backend backend_from_string(std::string_view name) {
  for (Backend b : {Backend::Auto, Backend::Reference, Backend::SDPA}) {
    if (name == to_string(b)) {
      return b;
    }
  }
  TORCH_CHECK(false, "backend: expected one of auto, reference, sdpa, got '", std::string(name), "'");
}

std::ostream& operator<<(std::ostream& os, Backend backend) { return os << to_string(backend); }

}  // namespace torchattn

// The extension's one PYBIND11_MODULE. It defines no function itself: it applies whatever the
// kernels/*_binding.cpp files registered (binding_registry.h), so adding a kernel never edits it.
#include "binding_registry.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  for (auto bind : opforge_bindings::binders()) bind(m);
}

#pragma once
// The registry of the released layout: every kernels/*_binding.cpp hands in one function that
// defines its Python entry points, and binding.cpp (the extension's only PYBIND11_MODULE) runs
// them all. Only pybind11 here, so binding.cpp compiles without torch's headers.
#include <pybind11/pybind11.h>

#include <vector>

namespace opforge_bindings {

using Binder = void (*)(pybind11::module_&);

// A function-local static: registrars of other translation units run during static
// initialisation, in an order the linker picks, so the list must exist on first use.
inline std::vector<Binder>& binders() {
  static std::vector<Binder> list;
  return list;
}

struct Registrar {
  explicit Registrar(Binder bind) { binders().push_back(bind); }
};

}  // namespace opforge_bindings

// REGISTER_BINDING(tag, fn): fn(pybind11::module_&) runs when Python imports the module. The tag
// only names the registrar object, so it must be unique within one extension.
#define REGISTER_BINDING(tag, fn) \
  static const ::opforge_bindings::Registrar opforge_binding_registrar_##tag { fn }

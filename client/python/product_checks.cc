#include "client/python/product_checks.h"

#include <torch/custom_class.h>

#include <stdexcept>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/product_checks.h"

namespace sdc::client {

void RegisterProductChecks(torch::Library& m) {
  m.class_<ProductChecks>("ProductChecks")
      .def("begin", &ProductChecks::Begin)
      .def("enter",
           [](const c10::intrusive_ptr<ProductChecks>& self) {
             const absl::Status s = self->Enter();
             // What sdc_guard/_C.py recognises as this library's own error.
             if (!s.ok()) {
               throw std::runtime_error(absl::StrCat(
                   "sdc_guard:", absl::StatusCodeToString(s.code()), ": ", s.message()));
             }
           })
      .def("exit", &ProductChecks::Exit)
      .def_property("checked", &ProductChecks::Checked)
      .def_property("unchecked", &ProductChecks::Unchecked)
      .def_property("alarms", &ProductChecks::Alarms)
      .def_property("rank", &ProductChecks::Rank);
}

}  // namespace sdc::client

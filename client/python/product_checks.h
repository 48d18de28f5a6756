#ifndef SDC_CLIENT_PYTHON_PRODUCT_CHECKS_H_
#define SDC_CLIENT_PYTHON_PRODUCT_CHECKS_H_

// The Python binding of the every-step product checksums (issue 45):
// client/product_checks.h's ProductChecks as the libtorch custom class
// torch.classes.sdc.ProductChecks, made by the engine (Engine.product_checks
// in engine_library.cc) and driven by sdc_guard/checksums.py. Errors reach
// Python as engine_library.cc's ("sdc_guard:CODE: message").

#include <torch/library.h>

namespace sdc::client {

// Registers torch.classes.sdc.ProductChecks (no constructor from Python:
// Engine.product_checks makes one) in the engine library's TORCH_LIBRARY,
// before the Engine class that returns it.
void RegisterProductChecks(torch::Library& m);

}  // namespace sdc::client

#endif  // SDC_CLIENT_PYTHON_PRODUCT_CHECKS_H_

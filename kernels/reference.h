#ifndef SDC_KERNELS_REFERENCE_H_
#define SDC_KERNELS_REFERENCE_H_

// Scalar reference implementations: the definitions in fingerprint.h and
// nonfinite.h written as directly as possible, one byte or element at a time.
// Tests hold every fast implementation (SIMD, threaded, CUDA) to these bits.
// testonly: too slow for production.

#include "kernels/fingerprint.h"
#include "kernels/nonfinite.h"

namespace sdc::kernels {

Fingerprint ReferenceFingerprint(ByteSpan tensor, const FingerprintKey& key);

// REQUIRES: tensor.dtype is one of DType's values.
ScanResult ReferenceScan(const TensorRef& tensor);

}  // namespace sdc::kernels

#endif  // SDC_KERNELS_REFERENCE_H_

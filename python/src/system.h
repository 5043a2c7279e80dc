// The Python object of one tpushim::System (system.cc); arrays.cc adds the
// array methods to the same class.

#ifndef TPUSHIM_PYTHON_SRC_SYSTEM_H_
#define TPUSHIM_PYTHON_SRC_SYSTEM_H_

#include <memory>

#include "python/src/common.h"

namespace tpushim_py {

struct PySystem {
  std::shared_ptr<Runtime> runtime;
};

}  // namespace tpushim_py

#endif  // TPUSHIM_PYTHON_SRC_SYSTEM_H_

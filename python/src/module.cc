// The extension module tpushim._tpushim. Import `tpushim`, not this: the
// package (python/tpushim/__init__.py) adds the Python side.

#include "python/src/common.h"

PYBIND11_MODULE(_tpushim, m) {
  m.doc() = "tpushim's C++ API for Python; import tpushim instead.";
  tpushim_py::RegisterCompletions(m);
  tpushim_py::RegisterEvents(m);
  tpushim_py::RegisterSystem(m);
  tpushim_py::RegisterArrays(m);
}

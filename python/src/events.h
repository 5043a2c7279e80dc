// The Python objects over the runtime's events (events.cc).

#ifndef TPUSHIM_PYTHON_SRC_EVENTS_H_
#define TPUSHIM_PYTHON_SRC_EVENTS_H_

#include <memory>

#include "tpushim/transfer.h"

namespace tpushim_py {

struct PyEvent {
  tpushim::Event event;
};

struct PyCallerEvent {
  std::unique_ptr<tpushim::CallerEvent> caller;
};

}  // namespace tpushim_py

#endif  // TPUSHIM_PYTHON_SRC_EVENTS_H_

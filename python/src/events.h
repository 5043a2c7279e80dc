// The Python objects over the runtime's events (events.cc).

#ifndef TPUSHIM_PYTHON_SRC_EVENTS_H_
#define TPUSHIM_PYTHON_SRC_EVENTS_H_

#include <memory>
#include <vector>

#include "python/src/common.h"
#include "tpushim/transfer.h"

namespace tpushim_py {

struct PyEvent {
  tpushim::Event event;
  // References the event's transfer needs kept alive; dropped when a wait
  // or done() sees the event ready (or with the last holder).
  std::vector<std::shared_ptr<KeepAlive>> holds;
};

struct PyCallerEvent {
  std::unique_ptr<tpushim::CallerEvent> caller;
};

}  // namespace tpushim_py

#endif  // TPUSHIM_PYTHON_SRC_EVENTS_H_

// The tests' name for common/subprocess.h: the tool tests run `tpushim`
// with an exact argv and environment through the same runner the tool
// itself uses for `tpushim tune`'s child processes.

#ifndef TPUSHIM_TESTS_TESTING_SUBPROCESS_H_
#define TPUSHIM_TESTS_TESTING_SUBPROCESS_H_

#include "common/subprocess.h"

namespace tpushim::testutil {

using ::tpushim::RunSubprocess;
using ::tpushim::SubprocessResult;

}  // namespace tpushim::testutil

#endif  // TPUSHIM_TESTS_TESTING_SUBPROCESS_H_

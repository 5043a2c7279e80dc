#!/usr/bin/env bash
# Debian's /usr/bin/python3 with clang's shared ASan runtime preloaded: the
# interpreter the asan job of scripts/test.sh builds and tests the Python
# package with. /usr/bin/python3 itself is not instrumented, so the
# extension (built with -fsanitize=address,undefined) finds the runtime
# only if it is loaded first; the shared runtime carries UBSan's handlers
# too. Leak checking is off in these processes: CPython and PyTorch keep
# memory until exit by design, so LeakSanitizer would report them, not us.
# Children (DataLoader workers, the tests' subprocesses) inherit both.
set -euo pipefail
runtime=$(clang -print-file-name=libclang_rt.asan-x86_64.so)
export LD_PRELOAD="$runtime${LD_PRELOAD:+:$LD_PRELOAD}"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
exec /usr/bin/python3 "$@"

// Symbol visibility for tpushim's public API.
//
// tpushim builds with -fvisibility=hidden; only declarations marked
// TPUSHIM_EXPORT are visible from libtpushim.so.

#ifndef TPUSHIM_EXPORT_H_
#define TPUSHIM_EXPORT_H_

#if defined(__GNUC__) || defined(__clang__)
#define TPUSHIM_EXPORT __attribute__((visibility("default")))
#else
#define TPUSHIM_EXPORT
#endif

#endif  // TPUSHIM_EXPORT_H_

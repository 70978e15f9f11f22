// The sandbox of an evaluator worker: no network and a read-only harness, entered by the
// `opforge worker` process before its interpreter starts (it must be single-threaded for
// unshare(CLONE_NEWUSER)).
//
// The evaluator asks for it through the worker's environment: OPFORGE_SANDBOX=1 and
// OPFORGE_SANDBOX_RO=<path>:<path>... (the project's python/ and data/, the venv, the tasks).
// Each step degrades gracefully where the platform refuses it (no user namespaces, seccomp):
// the worker logs a note and goes on, and OPFORGE_SANDBOX_STATE tells the evaluator what holds
// ("net,ro", "net", or "off: <why>"), which the report shows per solution.
#pragma once
#include <string>

namespace opforge::evaluator {

// Does nothing unless OPFORGE_SANDBOX=1. Never throws; returns the state it set.
std::string enter_sandbox_from_env();

}  // namespace opforge::evaluator

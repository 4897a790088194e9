// The early verdict of a device-side input check (sfa index scans, varlen prefix sums and block
// tables).  The check kernels leave ~0 or an encoding of the first violation in a device word;
// the host copies the word to a pinned word of its thread and records an event right after the
// checks, launches the work gated on the word (those kernels read it first and write nothing
// when it is set), then waits on that event only: the gated work runs on after the call returns,
// stream-ordered like any CUDA library call, and the call still reports the status.
#pragma once
#include <cuda_runtime.h>

// The pinned host word of the calling thread (read only by that thread's own call, after its
// event); NULL when it cannot be allocated.
unsigned long long *spattn_verdict_host_word(void);
// The verdict event of the calling thread for device dev (created once); NULL: none.
cudaEvent_t spattn_verdict_event(int dev);

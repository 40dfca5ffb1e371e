package statefile

// SyncingGoroutines is how many goroutines of an open File spend most of
// their time blocked in fsync(2) or fdatasync(2): the committer (the
// journal) and the marker (the mark file), which sync at the same time
// for consecutive group commits.
//
// A process that writes a File should run with this many Ps more than the
// runtime's default. A goroutine in a blocking system call keeps its P
// until the runtime's monitor takes it back, 20 µs to several ms later;
// on a host of two cores, two syncing goroutines leave no P for anything
// else in that time, so every group commit stalls the RPCs and the
// reconciler whose changes the next one carries. With the extra Ps the
// process may also run that many more goroutines at once outside a sync:
// on a CPU-limited container, a little more throttling in exchange for
// commits that stall nothing.
const SyncingGoroutines = 2

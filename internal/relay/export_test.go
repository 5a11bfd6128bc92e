package relay

// SetBeforeSlotLock sets the hook each session runs after it read the
// effects' partitions and before it takes the slot's lock, until the
// returned restore.
func SetBeforeSlotLock(f func()) (restore func()) {
	beforeSlotLock = f
	return func() { beforeSlotLock = nil }
}

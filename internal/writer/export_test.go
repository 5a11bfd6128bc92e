package writer

// SourceRowLock and SourceLockClass name a source's row's advisory lock,
// for a test to hold it as another writer would.
var SourceRowLock = sourceRowLock

const SourceLockClass = sourceLockClass

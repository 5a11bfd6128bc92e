package docstore

// ApplySQL exposes the store's write statement to the benchmark, which runs
// it with precomputed parameters as the limit the store is measured against.
var ApplySQL = applySQL

// LockSQL exposes the key-lock statement the store sends before ApplySQL.
const LockSQL = lockSQL

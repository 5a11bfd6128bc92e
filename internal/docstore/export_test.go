package docstore

// ApplySQL exposes the store's write statement to the benchmark, which runs
// it with precomputed parameters as the limit the store is measured against.
const ApplySQL = applySQL

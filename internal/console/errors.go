package console

import "errors"

// ErrNoReading is the answer before the console has read the pipeline
// once.
var ErrNoReading = errors.New("console: the pipeline has not been read yet")

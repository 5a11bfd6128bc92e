package embed

import (
	"fmt"
	"net/http"
)

// StatusError is an embeddings endpoint's answer with a status other than
// 2xx.
type StatusError struct {
	StatusCode int
	// Message is the server's error message (the "message" of an OpenAI
	// error body, else the body's text), truncated.
	Message string
}

func (e *StatusError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("status %d %s", e.StatusCode, http.StatusText(e.StatusCode))
	}
	return fmt.Sprintf("status %d %s: %s", e.StatusCode, http.StatusText(e.StatusCode), e.Message)
}

// SafeToRetry reports whether the same request may succeed later: the server
// was rate limiting (429) or failing (5xx). Any other status is an answer
// about the request itself.
func (e *StatusError) SafeToRetry() bool {
	return e.StatusCode == http.StatusTooManyRequests || e.StatusCode >= 500
}

// DimensionError is a vector whose length is not the configured dimension:
// the model is not the one configured, or the dimension is wrong.
type DimensionError struct {
	Got  int // length of the vector returned
	Want int // the configured dimension
}

func (e *DimensionError) Error() string {
	return fmt.Sprintf("the endpoint returned a vector of %d dimensions, the configured dimension is %d", e.Got, e.Want)
}

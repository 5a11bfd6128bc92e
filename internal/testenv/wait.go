package testenv

import (
	"testing"
	"time"
)

// Eventually polls cond every 20 ms until it holds, and fails the test
// after timeout, naming what it waited for.
func Eventually(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

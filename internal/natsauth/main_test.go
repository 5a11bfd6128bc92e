package natsauth_test

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"testing"

	"github.com/converge-sync/converge/internal/natsauth"
)

// TestMain runs the tests and then, when every test ran and passed,
// checks that the positive tests used every publish grant of every user:
// a grant no component uses is one to remove.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 && flag.Lookup("test.run").Value.String() == "" && !testing.Short() {
		code = reportUnused()
	}
	os.Exit(code)
}

// exempt are grants that the positive tests cannot use, with the reason
// they are granted all the same.
var exempt = map[string]map[string]string{
	natsauth.UserOperator: {
		// The rebuilds in progress are listed by an ordered push
		// consumer with flow control; the server asks for flow control
		// only with much more pending than a bucket of one key per
		// projector holds, and a refused answer would stall the listing.
		"$JS.FC.KV_CONVERGE_REBUILDS.>": "flow control of the listing of the rebuilds' bucket",
	},
	natsauth.ProjectorUser("index"): {
		// The same: a projector's watch of its members reads a handful of
		// keys.
		"$JS.FC.KV_CONVERGE_LEASES.>": "flow control of the watch of the projector's members",
	},
	natsauth.ProjectorUser("graph"): {
		"$JS.FC.KV_CONVERGE_LEASES.>": "flow control of the watch of the projector's members",
	},
	natsauth.UserNotifier: {
		"$JS.FC.KV_CONVERGE_LEASES.>": "flow control of the watch of the notifier's members",
	},
}

func reportUnused() int {
	grantsUsed.Lock()
	defer grantsUsed.Unlock()
	code := 0
	perms := natsauth.Permissions()
	for _, u := range slices.Sorted(maps.Keys(perms)) {
		for _, g := range perms[u].Publish.Allow {
			if !grantsUsed.m[u][g] && exempt[u][g] == "" {
				fmt.Fprintf(os.Stderr, "natsauth: %s is granted %s, which no positive test used\n", u, g)
				code = 1
			}
		}
	}
	return code
}

package roles_test

import (
	"strings"
	"testing"

	"github.com/converge-sync/converge/internal/roles"
)

// The database and the addresses are written as pg_hba.conf reads them: a
// name that is a keyword of the database field or holds other characters
// than letters, digits and _ in double quotes, an IP address as the range
// of that address alone; what cannot be written is refused.
func TestHBAWritesNamesAndAddressesAsTheFileReadsThem(t *testing.T) {
	for _, c := range []struct {
		db, relay, want, err string
	}{
		{db: "converge", relay: "10.0.0.5", want: "hostssl converge converge_relay 10.0.0.5/32 scram-sha-256"},
		{db: "", relay: "10.0.0.7/24", want: "hostssl converge converge_relay 10.0.0.0/24 scram-sha-256"},
		{db: "all", relay: "::ffff:10.0.0.5", want: `hostssl "all" converge_relay 10.0.0.5/32 scram-sha-256`},
		{db: "Replication", relay: "fd00::1", want: `hostssl "Replication" converge_relay fd00::1/128 scram-sha-256`},
		{db: "my db,2", relay: "", want: `hostssl "my db,2" converge_relay <address> scram-sha-256`},
		{db: `a"b`, relay: "10.0.0.5", err: "double quote"},
		{db: "x", relay: "relay.internal", err: "not an IP address"},
		{db: "x", relay: "fe80::1%eth0", err: "not an IP address"},
	} {
		lines, err := roles.HBA(roles.HBAOptions{Database: c.db, RelayAddress: c.relay, OwnerAddress: "10.0.0.9"})
		switch {
		case c.err != "":
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("database %q, relay %q: %v, want an error with %q", c.db, c.relay, err, c.err)
			}
		case err != nil:
			t.Errorf("database %q, relay %q: %v", c.db, c.relay, err)
		case lines[0].Line != c.want:
			t.Errorf("database %q, relay %q: %q, want %q", c.db, c.relay, lines[0].Line, c.want)
		}
	}
}

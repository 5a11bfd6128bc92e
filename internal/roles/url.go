package roles

import (
	"fmt"
	"net/url"
)

// URL is base (a postgres:// URL) with role and password as its user: the
// URL a service connects with. An empty password leaves none in the URL
// (for a server that does not ask, or a password from PGPASSWORD or
// ~/.pgpass).
func URL(base, role, password string) (string, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("roles: %q is not a postgres:// URL", redact(base))
	}
	if password == "" {
		u.User = url.User(role)
	} else {
		u.User = url.UserPassword(role, password)
	}
	return u.String(), nil
}

func redact(s string) string {
	if u, err := url.Parse(s); err == nil {
		return u.Redacted()
	}
	return "(unparsable)"
}

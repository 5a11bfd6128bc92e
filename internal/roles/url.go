package roles

import (
	"errors"
	"net/url"
)

// URL is base (a postgres:// URL) with role and password as its user: the
// URL a service connects with. An empty password leaves none in the URL
// (for a server that does not ask, or a password from PGPASSWORD or
// ~/.pgpass).
func URL(base, role, password string) (string, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		// Not echoed: a keyword DSN would show its password.
		return "", errors.New("roles: the base must be a postgres:// URL")
	}
	if password == "" {
		u.User = url.User(role)
	} else {
		u.User = url.UserPassword(role, password)
	}
	return u.String(), nil
}

package natsauth

import (
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/converge-sync/converge/internal/config"
)

// Environment variables of a service's NATS credentials. A secret may be
// given as <variable>_FILE instead; the password is read from the
// environment only, never from a flag (a flag's value is in the process
// list).
const (
	EnvCreds    = "CONVERGE_NATS_CREDS" //nolint:gosec // the names of variables, not credentials
	EnvNKey     = "CONVERGE_NATS_NKEY"
	EnvUser     = "CONVERGE_NATS_USER"
	EnvPassword = "CONVERGE_NATS_PASSWORD" //nolint:gosec // as above
	EnvCA       = "CONVERGE_NATS_CA"
	EnvCert     = "CONVERGE_NATS_CERT"
	EnvKey      = "CONVERGE_NATS_KEY"
	EnvInbox    = "CONVERGE_NATS_INBOX_PREFIX"
)

// ClientConfig is how a service authenticates to NATS: at most one of a
// creds file (a JWT and its seed), an nkey seed file, or a user and
// password; and TLS: the CA that signed the server's certificate, and a
// client certificate. The zero value connects without credentials.
type ClientConfig struct {
	CredsFile string
	NKeyFile  string
	User      string
	Password  string
	CAFile    string
	CertFile  string
	KeyFile   string
	// InboxPrefix is where the client's replies, pull deliveries and
	// key-value answers come: the one prefix its permissions let it
	// subscribe to. Empty: [InboxPrefix](User) with a user; with a creds
	// file or an nkey, whose user the client does not know, nats.go's
	// shared _INBOX, which every user allowed _INBOX.> reads.
	InboxPrefix string
}

// Validate reports credentials that cannot work: two ways of
// authenticating at once, a user without a password or the reverse, a user
// name that cannot name its inboxes ([InboxPrefix]), a certificate without
// its key or the reverse.
func (c ClientConfig) Validate() error {
	ways := 0
	for _, set := range []bool{c.CredsFile != "", c.NKeyFile != "", c.User != "" || c.Password != ""} {
		if set {
			ways++
		}
	}
	var errs []error
	if ways > 1 {
		errs = append(errs, errors.New("give one of a creds file, an nkey seed file, or a user and password"))
	}
	if c.User != "" && c.Password == "" {
		errs = append(errs, fmt.Errorf("user %q has no password (%s or %s_FILE)", c.User, EnvPassword, EnvPassword))
	}
	if strings.ContainsAny(c.User, ".*> \t\r\n") {
		errs = append(errs, fmt.Errorf("user %q: a user name names its inboxes, so it is one subject token, without '.', '*', '>' or white space", c.User))
	}
	if c.User == "" && c.Password != "" {
		errs = append(errs, fmt.Errorf("a password without a user (-nats-user or %s)", EnvUser))
	}
	if c.InboxPrefix != "" && (strings.ContainsAny(c.InboxPrefix, "*> \t\r\n") || strings.HasSuffix(c.InboxPrefix, ".") || strings.HasPrefix(c.InboxPrefix, ".")) {
		errs = append(errs, fmt.Errorf("inbox prefix %q: want subject tokens without wildcards, white space or a leading or trailing '.' (as in %s)", c.InboxPrefix, InboxPrefix(UserRelay)))
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		errs = append(errs, errors.New("a client certificate needs both -nats-cert and -nats-key"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("natsauth: %w", err)
	}
	return nil
}

// Options are the nats.Connect options of c. Its inboxes are under
// c.InboxPrefix; without one, with a user, under [InboxPrefix](user), where
// its permission set lets it subscribe; with a creds file or an nkey and no
// prefix, nats.go's default _INBOX.
func (c ClientConfig) Options() ([]nats.Option, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	var opts []nats.Option
	switch {
	case c.CredsFile != "":
		opts = append(opts, nats.UserCredentials(c.CredsFile))
	case c.NKeyFile != "":
		o, err := nats.NkeyOptionFromSeed(c.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("natsauth: nkey seed %s: %w", c.NKeyFile, err)
		}
		opts = append(opts, o)
	case c.User != "":
		opts = append(opts, nats.UserInfo(c.User, c.Password))
	}
	switch {
	case c.InboxPrefix != "":
		opts = append(opts, nats.CustomInboxPrefix(c.InboxPrefix))
	case c.User != "":
		opts = append(opts, nats.CustomInboxPrefix(InboxPrefix(c.User)))
	}
	if c.CAFile != "" {
		opts = append(opts, nats.RootCAs(c.CAFile))
	}
	if c.CertFile != "" {
		opts = append(opts, nats.ClientCert(c.CertFile, c.KeyFile))
	}
	return opts, nil
}

// Flags binds a service's NATS credentials to flags and their variables:
// -nats-creds, -nats-nkey, -nats-user, -nats-ca, -nats-cert, -nats-key, -nats-inbox-prefix;
// the password only from CONVERGE_NATS_PASSWORD or its _FILE. Call the
// returned function after parsing.
func Flags(f *config.Flags) func() (ClientConfig, error) {
	creds := f.String("nats-creds", EnvCreds, "", "NATS credentials file (a user JWT and its seed)")
	nkey := f.String("nats-nkey", EnvNKey, "", "NATS nkey seed file")
	user := f.String("nats-user", EnvUser, "", "NATS user (its password from "+EnvPassword+" or "+EnvPassword+"_FILE)")
	ca := f.String("nats-ca", EnvCA, "", "CA certificate (PEM) that signed the NATS server's certificate")
	cert := f.String("nats-cert", EnvCert, "", "client certificate (PEM) presented to the NATS server")
	key := f.String("nats-key", EnvKey, "", "private key (PEM) of -nats-cert")
	inbox := f.String("nats-inbox-prefix", EnvInbox, "",
		"prefix of the client's reply subjects, the one its NATS permissions let it subscribe to (empty: _INBOX_<user> with -nats-user; with -nats-creds or -nats-nkey give the prefix the account grants, e.g. _INBOX_relay, or replies use the shared _INBOX)")
	return func() (ClientConfig, error) {
		pw, _, err := f.Env(EnvPassword)
		if err != nil {
			return ClientConfig{}, err
		}
		c := ClientConfig{CredsFile: *creds, NKeyFile: *nkey, User: *user, Password: pw, CAFile: *ca, CertFile: *cert, KeyFile: *key, InboxPrefix: *inbox}
		if err := c.Validate(); err != nil {
			return ClientConfig{}, err
		}
		return c, nil
	}
}

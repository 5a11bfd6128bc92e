// Command secretgen makes the secrets of the docker-compose.yml stack that
// need more than random bytes: a certificate authority and a server
// certificate for each service that listens (Postgres, NATS, the HTTP
// listeners of the writer, the relay and the projectors; the notifier
// takes no certificate yet), and the NATS users of internal/natsauth with
// the bcrypt hashes of random passwords. deploy/secrets.sh runs it as
// `go run ./deploy/secretgen DIR`, after the values it makes itself.
//
// It is Go, not shell, because a host need not have openssl, and nothing
// in a default Debian makes a certificate or a bcrypt hash; Go is what the
// repository builds with, and the users come from natsauth's code, so that
// the stack's permissions are always those of the binaries it runs.
//
// Like the rest of the stack's secrets, everything is made once and kept:
// a run changes nothing that is still good. A certificate is made again
// when it is missing, does not chain to the CA, names other hosts than it
// should, or has less than 30 days left; the CA when it is missing or has
// less than a year left, which makes every certificate again. The NATS
// passwords are kept; nats-users.conf is written again every run (the
// permissions follow the code) with each hash kept while it matches its
// password.
//
// In DIR:
//
//	ca.crt, ca.key          the CA (its key is never mounted: 0600)
//	<server>.crt, .key      a server's certificate and key, for the names
//	                        in [servers] and localhost, 127.0.0.1, ::1
//	nats-<user>-password    the password of each natsauth user
//	nats-users.conf         the users for nats-server: bcrypt hashes and
//	                        permissions (deploy/nats/server.conf includes it)
package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"golang.org/x/crypto/bcrypt"

	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/natsserver"
)

// servers are the certificates to make, by file name, and the compose
// service names each must be valid for. NATS has one certificate for its
// three nodes (docker-compose.cluster.yml), which also present it to each
// other on their routes.
var servers = map[string][]string{
	"postgres":        {"postgres"},
	"nats":            {"nats", "nats-2", "nats-3"},
	"writer":          {"writer"},
	"relay":           {"relay"},
	"projector-index": {"projector-index"},
	"projector-graph": {"projector-graph"},
	"notifier":        {"notifier"},
}

// localNames are in every certificate: a healthcheck asks its own
// container at localhost, and the host reaches the published ports at
// 127.0.0.1.
var localNames = []string{"localhost", "127.0.0.1", "::1"}

const (
	caValidity    = 10 * 365 * 24 * time.Hour
	caRenewBefore = 365 * 24 * time.Hour
	// certValidity stays under the 825 days some TLS clients accept.
	certValidity    = 820 * 24 * time.Hour
	certRenewBefore = 30 * 24 * time.Hour
	bcryptCost      = 11
)

func main() {
	if len(os.Args) != 2 || os.Args[1] == "" || strings.HasPrefix(os.Args[1], "-") {
		fmt.Fprintln(os.Stderr, "usage: go run ./deploy/secretgen DIR")
		os.Exit(2)
	}
	if err := run(os.Args[1], time.Now()); err != nil {
		fmt.Fprintln(os.Stderr, "secretgen:", err)
		os.Exit(1)
	}
}

func run(dir string, now time.Time) error {
	ca, err := keepCA(dir, now)
	if err != nil {
		return err
	}
	for _, name := range slices.Sorted(maps.Keys(servers)) {
		if err := keepCert(dir, name, append(slices.Clone(servers[name]), localNames...), ca, now); err != nil {
			return err
		}
	}
	return writeNATSUsers(dir)
}

// authority is the CA, its certificate parsed and its key.
type authority struct {
	cert *x509.Certificate
	key  crypto.Signer
}

// keepCA returns the CA of dir, made anew when it is missing or near its
// end; the certificates it signed then no longer chain to it and
// keepCert makes them again.
func keepCA(dir string, now time.Time) (authority, error) {
	certFile, keyFile := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	if cert, key, err := loadPair(certFile, keyFile); err == nil && cert.IsCA && now.Add(caRenewBefore).Before(cert.NotAfter) {
		return authority{cert, key}, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return authority{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "converge local CA " + now.UTC().Format("2006-01-02")},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return authority{}, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return authority{}, err
	}
	if err := writePair(certFile, keyFile, der, key, 0o600); err != nil {
		return authority{}, err
	}
	return authority{cert, key}, nil
}

// keepCert makes dir/name.crt and .key for names unless the pair there
// is still good: signed by ca, for exactly names, and not near its end.
func keepCert(dir, name string, names []string, ca authority, now time.Time) error {
	certFile, keyFile := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if cert, _, err := loadPair(certFile, keyFile); err == nil && stillGood(cert, names, ca, now) {
		return nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: names[0]},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		// Client authentication too: NATS nodes present their certificate
		// to each other on the cluster's routes.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return err
	}
	// Readable by all: Compose mounts the file as it is, and the
	// containers' users are not its owner (the directory is yours alone).
	return writePair(certFile, keyFile, der, key, 0o644)
}

func stillGood(cert *x509.Certificate, names []string, ca authority, now time.Time) bool {
	if !now.Add(certRenewBefore).Before(cert.NotAfter) || cert.CheckSignatureFrom(ca.cert) != nil {
		return false
	}
	var have []string
	have = append(have, cert.DNSNames...)
	for _, ip := range cert.IPAddresses {
		have = append(have, ip.String())
	}
	want := make([]string, 0, len(names))
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			n = ip.String()
		}
		want = append(want, n)
	}
	slices.Sort(have)
	slices.Sort(want)
	return slices.Equal(have, want)
}

// loadPair reads a PEM certificate and its PKCS #8 key, and checks that
// they belong together.
func loadPair(certFile, keyFile string) (*x509.Certificate, crypto.Signer, error) {
	cb, err := os.ReadFile(certFile)
	if err != nil {
		return nil, nil, err
	}
	kb, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, nil, err
	}
	cp, _ := pem.Decode(cb)
	kp, _ := pem.Decode(kb)
	if cp == nil || kp == nil {
		return nil, nil, errors.New("not PEM")
	}
	cert, err := x509.ParseCertificate(cp.Bytes)
	if err != nil {
		return nil, nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(kp.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, nil, errors.New("the key is not the certificate's")
	}
	return cert, key, nil
}

// writePair writes the certificate (0644) and its key in PKCS #8, which
// Postgres, nats-server and Go all read, with keyMode.
func writePair(certFile, keyFile string, der []byte, key *ecdsa.PrivateKey, keyMode os.FileMode) error {
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	// Should the second write fail, the pair does not match and the next
	// run makes both again.
	if err := writeFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), keyMode); err != nil {
		return err
	}
	return writeFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

// writeFile replaces path in one step, so that a reader never sees half a
// file.
func writeFile(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return err
	}
	if err := os.Chmod(tmp, mode); err != nil { // os.WriteFile's mode passes the umask
		return err
	}
	return os.Rename(tmp, path)
}

func serial() *big.Int {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return new(big.Int).SetBytes(b)
}

// randomValue is as deploy/secrets.sh makes them: 24 random bytes in
// hexadecimal, safe in URLs and configuration files.
func randomValue() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// writeNATSUsers keeps a password for every natsauth user and writes
// nats-users.conf: each user with the hash of its password and its
// permissions.
func writeNATSUsers(dir string) error {
	usersFile := filepath.Join(dir, "nats-users.conf")
	old := map[string]string{} // user -> hash in the file before
	if _, err := os.Stat(usersFile); err == nil {
		if opts, err := server.ProcessConfigFile(usersFile); err == nil {
			for _, u := range opts.Users {
				old[u.Username] = u.Password
			}
		}
	}
	perms := natsauth.Permissions()
	hashes := map[string]string{}
	for _, user := range slices.Sorted(maps.Keys(perms)) {
		file := filepath.Join(dir, "nats-"+user+"-password")
		pw, err := keepValue(file)
		if err != nil {
			return err
		}
		if h := old[user]; h != "" && bcrypt.CompareHashAndPassword([]byte(h), []byte(pw)) == nil {
			hashes[user] = h
			continue
		}
		h, err := bcrypt.GenerateFromPassword([]byte(pw), bcryptCost)
		if err != nil {
			return err
		}
		hashes[user] = string(h)
	}
	return writeFile(usersFile, []byte(usersHeader+natsserver.UsersConf(natsauth.Users(hashes))), 0o644)
}

// keepValue returns the value in file, first making it random when the
// file is missing or empty.
func keepValue(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err == nil {
		if v := strings.TrimSpace(string(b)); v != "" {
			return v, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	v := randomValue()
	return v, writeFile(file, []byte(v+"\n"), 0o644)
}

// usersHeader heads nats-users.conf.
const usersHeader = "# The NATS users of the docker-compose.yml stack, made by deploy/secretgen\n" +
	"# from internal/natsauth; each password is in nats-<user>-password.\n"

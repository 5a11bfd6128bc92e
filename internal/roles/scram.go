package roles

import (
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
)

// scramIterations is Postgres's default (scram_iterations in 16+).
const scramIterations = 4096

// scramVerifier is the SCRAM-SHA-256 verifier Postgres stores for password
// (RFC 5802, RFC 7677), as CREATE/ALTER ROLE ... PASSWORD accepts it:
// SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>. Postgres
// SASLpreps a password before hashing it; for printable ASCII, the only
// passwords accepted here, that changes nothing.
func scramVerifier(password string, salt []byte) (string, error) {
	salted, err := pbkdf2.Key(sha256.New, password, salt, scramIterations, sha256.Size)
	if err != nil {
		return "", fmt.Errorf("roles: scram: %w", err)
	}
	clientKey := hmacSHA256(salted, "Client Key")
	storedKey := sha256.Sum256(clientKey)
	serverKey := hmacSHA256(salted, "Server Key")
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Sprintf("SCRAM-SHA-256$%d:%s$%s:%s", scramIterations, b64(salt), b64(storedKey[:]), b64(serverKey)), nil
}

func hmacSHA256(key []byte, msg string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(msg))
	return h.Sum(nil)
}

// newSalt is a random 16-byte salt, as Postgres makes.
func newSalt() []byte {
	salt := make([]byte, 16)
	_, _ = rand.Read(salt) // crypto/rand.Read never fails (it crashes the program instead)
	return salt
}

// checkPassword accepts printable ASCII only: such a password is the same
// after SASLprep, so the verifier made here matches what every client
// proves, and it can be put in a URL (percent-encoded).
func checkPassword(role, password string) error {
	for i := 0; i < len(password); i++ {
		if c := password[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("roles: the password of %s has a character outside printable ASCII (at byte %d)", role, i)
		}
	}
	return nil
}

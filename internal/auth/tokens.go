package auth

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
)

// EnvTokensFile is the variable of -tokens-file.
const EnvTokensFile = "CONVERGE_TOKENS_FILE" //nolint:gosec // the name of a variable, not a credential

// MinTokenBytes is the shortest token a tokens file may hold.
const MinTokenBytes = 16

// Scope is what a token allows; a Scope value may hold several.
type Scope uint8

// The scopes. They are independent: Admin implies neither Write nor Read.
const (
	Write Scope = 1 << iota // store and withdraw documents
	Admin                   // re-emit events, rebuild projections
	Read                    // search, read the graph, verify digests
)

var scopeNames = []struct {
	s    Scope
	name string
}{{Write, "write"}, {Admin, "admin"}, {Read, "read"}}

// String is the scopes' names, comma-separated, as in a tokens file.
func (s Scope) String() string {
	var names []string
	for _, n := range scopeNames {
		if s&n.s != 0 {
			names = append(names, n.name)
		}
	}
	return strings.Join(names, ",")
}

// ParseScopes parses comma-separated scope names ("admin,read").
func ParseScopes(text string) (Scope, error) {
	var s Scope
	for name := range strings.SplitSeq(text, ",") {
		known := false
		for _, n := range scopeNames {
			if name == n.name {
				s, known = s|n.s, true
			}
		}
		if !known {
			// Should the columns be swapped, the token would be here: a
			// value as long as a token is not repeated.
			if len(name) >= MinTokenBytes {
				return 0, fmt.Errorf("%w (%d bytes, not shown; the scopes are write, admin and read)", ErrUnknownScope, len(name))
			}
			return 0, fmt.Errorf("%w %q (the scopes are write, admin and read)", ErrUnknownScope, name)
		}
	}
	return s, nil
}

// entry is one token of the file, kept as its digest.
type entry struct {
	name   string
	scopes Scope
	sum    [sha256.Size]byte
}

// tokenSet is one reading of a tokens file.
type tokenSet struct{ entries []entry }

// match returns the index of the entry whose token has the digest sum, or
// -1, and how many entries it compared: always all of them, so that the
// time taken says nothing of which token matched, or how many bytes of it.
func (s *tokenSet) match(sum [sha256.Size]byte) (index, compared int) {
	index = -1
	for i := range s.entries {
		eq := subtle.ConstantTimeCompare(sum[:], s.entries[i].sum[:])
		index = subtle.ConstantTimeSelect(eq, i, index)
		compared++
	}
	return index, compared
}

// parse reads a tokens file's text; path only names it in errors.
func parse(path string, data []byte) (*tokenSet, error) {
	set := &tokenSet{}
	seen := map[[sha256.Size]byte]int{} // digest -> line
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		lineErr := func(err error, detail string) error {
			return &LineError{Path: path, Line: line, Err: err, Detail: detail}
		}
		fields := strings.Fields(text)
		switch {
		case len(fields) == 2:
			return nil, lineErr(ErrEmptyToken, "want: name scopes token")
		case len(fields) != 3:
			return nil, lineErr(ErrMalformedLine, fmt.Sprintf("found %d fields, want 3", len(fields)))
		}
		name, scopesText, token := fields[0], fields[1], fields[2]
		scopes, err := ParseScopes(scopesText)
		if err != nil {
			return nil, &LineError{Path: path, Line: line, Err: err}
		}
		if len(token) < MinTokenBytes {
			return nil, lineErr(ErrShortToken, fmt.Sprintf("it has %d", len(token)))
		}
		for i := 0; i < len(token); i++ {
			if token[i] < 0x21 || token[i] > 0x7e {
				return nil, lineErr(ErrTokenCharacter, fmt.Sprintf("at byte %d", i+1))
			}
		}
		sum := sha256.Sum256([]byte(token))
		if first, dup := seen[sum]; dup {
			return nil, lineErr(ErrDuplicateToken, fmt.Sprintf("line %d", first))
		}
		seen[sum] = line
		set.entries = append(set.entries, entry{name: name, scopes: scopes, sum: sum})
	}
	if err := sc.Err(); err != nil {
		return nil, &LineError{Path: path, Line: line + 1, Err: ErrMalformedLine, Detail: err.Error()}
	}
	if len(set.entries) == 0 {
		if path != "" {
			return nil, fmt.Errorf("auth: tokens file %s: %w", path, ErrNoTokens)
		}
		return nil, fmt.Errorf("auth: tokens file: %w", ErrNoTokens)
	}
	return set, nil
}

func readFile(path string) (*tokenSet, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: tokens file: %w", err)
	}
	return parse(path, data)
}

// Tokens are the bearer tokens a service accepts. A nil or empty Tokens
// accepts any request: authentication is off.
type Tokens struct {
	path string
	set  atomic.Pointer[tokenSet]
}

// Load reads the tokens file at path.
func Load(path string) (*Tokens, error) {
	set, err := readFile(path)
	if err != nil {
		return nil, err
	}
	t := &Tokens{path: path}
	t.set.Store(set)
	return t, nil
}

// Path is the file the tokens were read from.
func (t *Tokens) Path() string {
	if t == nil {
		return ""
	}
	return t.path
}

// Enabled reports whether t holds any token: whether requests are checked.
func (t *Tokens) Enabled() bool { return t.Len() > 0 }

// Len is the number of tokens.
func (t *Tokens) Len() int {
	if t == nil {
		return 0
	}
	if s := t.set.Load(); s != nil {
		return len(s.entries)
	}
	return 0
}

// Reload reads the file again and puts its tokens in force at once. A file
// that cannot be read or parsed leaves the previous tokens in force, and
// its error is returned.
func (t *Tokens) Reload() error {
	if t == nil || t.path == "" {
		return nil
	}
	set, err := readFile(t.path)
	if err != nil {
		return err
	}
	t.set.Store(set)
	return nil
}

// Watch reloads the file on each SIGHUP until ctx ends, logging the
// outcome; a failed reload keeps the previous tokens. Only SIGHUP is
// caught, and only while Watch runs.
func (t *Tokens) Watch(ctx context.Context, log *slog.Logger) {
	if t == nil || t.path == "" {
		return
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			if err := t.Reload(); err != nil {
				log.Error("tokens file not reloaded: the previous tokens stay in force", "path", t.path, "err", err)
				continue
			}
			log.Info("tokens file reloaded", "path", t.path, "tokens", t.Len())
		}
	}
}

// lookup returns the name and scopes of token, and whether it is known.
func (t *Tokens) lookup(token string) (name string, scopes Scope, ok bool) {
	s := t.set.Load()
	if s == nil {
		return "", 0, false
	}
	i, _ := s.match(sha256.Sum256([]byte(token)))
	if i < 0 {
		return "", 0, false
	}
	return s.entries[i].name, s.entries[i].scopes, true
}

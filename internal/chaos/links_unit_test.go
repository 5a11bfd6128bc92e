//go:build linux

package chaos

import "testing"

func TestReplaceAddr(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"nats://127.0.0.1:4222", "nats://127.0.0.1:9999"},
		{"postgres://u:p@127.0.0.1:4222/db?x=1", "postgres://u:p@127.0.0.1:9999/db?x=1"},
		{"127.0.0.1:42220", "127.0.0.1:42220"},
		{"a=127.0.0.1:4222,127.0.0.1:42221,127.0.0.1:4222", "a=127.0.0.1:9999,127.0.0.1:42221,127.0.0.1:9999"},
		{"-metrics-addr", "-metrics-addr"},
	} {
		if got := replaceAddr(c.in, "127.0.0.1:4222", "127.0.0.1:9999"); got != c.want {
			t.Errorf("replaceAddr(%q) = %q, want %q", c.in, got, c.want)
		}
		if got, want := containsAddr(c.in, "127.0.0.1:4222"), c.in != c.want; got != want {
			t.Errorf("containsAddr(%q) = %v, want %v", c.in, got, want)
		}
	}
}

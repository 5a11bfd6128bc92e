package testenv

import (
	"net/http"
	"strings"
	"testing"
)

// StartQdrantTLS's instance answers over TLS to a client that trusts the
// CA, and through its plain fronts, with the API key alone; it refuses
// plain HTTP on its own port and a client that trusts other roots.
func TestStartQdrantTLS(t *testing.T) {
	certs := NewCertificates(t)
	q := StartQdrantTLS(t, certs)
	status := func(client *http.Client, url, key string) (int, error) {
		req, err := http.NewRequest(http.MethodGet, url+"/collections", nil)
		if err != nil {
			return 0, err
		}
		if key != "" {
			req.Header.Set("api-key", key)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		_ = resp.Body.Close()
		return resp.StatusCode, nil
	}
	trusting := &http.Client{Transport: &http.Transport{TLSClientConfig: certs.ClientTLS()}}
	t.Cleanup(trusting.CloseIdleConnections)
	for _, c := range []struct {
		what   string
		client *http.Client
		url    string
		key    string
		want   int // 0: the request fails
	}{
		{"https with the CA and the key", trusting, q.TLSHTTPURL, q.APIKey, http.StatusOK},
		{"https with the CA, no key", trusting, q.TLSHTTPURL, "", http.StatusUnauthorized},
		{"the plain front with the key", http.DefaultClient, q.HTTPURL, q.APIKey, http.StatusOK},
		{"https without the CA", http.DefaultClient, q.TLSHTTPURL, q.APIKey, 0},
		{"plain http on the TLS port", http.DefaultClient, "http://" + strings.TrimPrefix(q.TLSHTTPURL, "https://"), q.APIKey, 0},
	} {
		got, err := status(c.client, c.url, c.key)
		if got != c.want {
			t.Errorf("%s: %d (%v), want %d", c.what, got, err, c.want)
		}
	}
}

package httpjson

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
)

func answer(status int, body string) *http.Response {
	rec := httptest.NewRecorder()
	rec.WriteHeader(status)
	_, _ = rec.WriteString(body)
	return rec.Result()
}

func TestRead(t *testing.T) {
	var out struct{ N int }
	if err := Read(answer(200, `{"N":3}`), 1<<10, &out); err != nil || out.N != 3 {
		t.Fatalf("200: %v, %+v", err, out)
	}
	if err := Read(answer(202, `{"N":4}`), 1<<10, &out, 200, 202); err != nil || out.N != 4 {
		t.Fatalf("202 accepted: %v, %+v", err, out)
	}
	var se *StatusError
	err := Read(answer(409, `{"error":{"code":"version_conflict","message":"stale"}}`), 1<<10, &out)
	if !errors.As(err, &se) || se.StatusCode != 409 || se.Code != "version_conflict" || se.Message != "stale" {
		t.Fatalf("an API error: %#v", err)
	}
	err = Read(answer(502, "<html>bad gateway</html>\n"), 1<<10, &out)
	if !errors.As(err, &se) || se.Code != "" || se.Message != "<html>bad gateway</html>" {
		t.Fatalf("a body that is not the error shape: %#v", err)
	}
	if err := Read(answer(200, `{"N":`), 1<<10, &out); !errors.Is(err, ErrUnreadable) {
		t.Fatalf("truncated JSON: %v", err)
	}
	if err := Read(answer(200, `{"N":1234567}`), 5, &out); !errors.Is(err, ErrUnreadable) {
		t.Fatalf("an answer past the limit: %v", err)
	}
	if err := Read(answer(200, `anything`), 1<<10, nil); err != nil {
		t.Fatalf("out nil: %v", err)
	}
}

func TestGet(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer sk_0123456789abcdef" {
			Error(w, http.StatusUnauthorized, "unauthorized", "no token")
			return
		}
		Write(w, http.StatusOK, map[string]int{"N": 5})
	}))
	var out struct{ N int }
	if err := Get(context.Background(), nil, srv.URL, "sk_0123456789abcdef", 1<<10, &out); err != nil || out.N != 5 {
		t.Fatalf("with the token: %v, %+v", err, out)
	}
	var se *StatusError
	if err := Get(context.Background(), nil, srv.URL, "", 1<<10, &out); !errors.As(err, &se) || se.Code != "unauthorized" {
		t.Fatalf("without the token: %v", err)
	}
	srv.Close()
	if err := Get(context.Background(), nil, srv.URL, "", 1<<10, &out); !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("a closed server: %v", err)
	}
}

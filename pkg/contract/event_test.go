package contract_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/converge-sync/converge/pkg/contract"
)

func sampleEvent(t testing.TB) contract.Event {
	t.Helper()
	d, err := contract.Document{
		Key: "docs/intro.md", Version: 3, Title: "Intro", Body: "# Intro\n\nHello <world> & friends\n",
		Links: []string{"docs/next.md"}, Tags: []string{"guide"}, Meta: json.RawMessage(`{"lang":"en"}`),
	}.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	return contract.NewUpsertedEvent(d, []string{"# Intro\n\n", "Hello <world> & friends\n"})
}

func TestEventRoundTrip(t *testing.T) {
	for _, ev := range []contract.Event{sampleEvent(t), contract.NewWithdrawnEvent("docs/intro.md", 4)} {
		data, err := ev.Encode()
		if err != nil {
			t.Fatal(err)
		}
		got, err := contract.DecodeEvent(data)
		if err != nil {
			t.Fatalf("decode %s: %v", data, err)
		}
		again, err := got.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(data, again) {
			t.Fatalf("encoding is not canonical:\n%s\n%s", data, again)
		}
	}
}

func TestEventEncodingKnownAnswer(t *testing.T) {
	data, err := contract.NewWithdrawnEvent("docs/intro.md", 4).Encode()
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"schema":"converge.event.v1","id":"b53816c2-2637-57ba-b67b-7a12f08cacb8","kind":"document.withdrawn","key":"docs/intro.md","version":4,"title":"","links":[],"tags":[],"meta":{},"chunks":[],"content_hash":"383d735598aaf7731de655088661794b37d4febdd5aee673b4a7261cda70f2fe"}`
	if string(data) != want {
		t.Fatalf("got  %s\nwant %s", data, want)
	}
	if !strings.Contains(string(mustEncode(t, sampleEvent(t))), "Hello <world> & friends") {
		t.Fatal("HTML characters must not be escaped in the canonical encoding")
	}
}

func mustEncode(t *testing.T, e contract.Event) []byte {
	t.Helper()
	b, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeEventRejectsForgeries(t *testing.T) {
	valid := string(mustEncode(t, sampleEvent(t)))
	tests := []struct {
		name string
		data string
		code string
	}{
		{"not json", `{"schema":`, contract.CodeInvalidJSON},
		{"trailing data", valid + ` {}`, contract.CodeInvalidJSON},
		{"unknown field", strings.Replace(valid, `"schema"`, `"extra":1,"schema"`, 1), contract.CodeInvalidJSON},
		{"unknown schema", strings.Replace(valid, contract.SchemaV1, "converge.event.v9", 1), contract.CodeUnknownSchema},
		{"unknown kind", strings.Replace(valid, `"document.upserted"`, `"document.moved"`, 1), contract.CodeInvalidEvent},
		{"version changed", strings.Replace(valid, `"version":3`, `"version":4`, 1), contract.CodeIdentityMismatch},
		{"body tampered", strings.Replace(valid, "friends", "fiends", 1), contract.CodeIdentityMismatch},
		{"title tampered", strings.Replace(valid, `"title":"Intro"`, `"title":"Outro"`, 1), contract.CodeIdentityMismatch},
		{"zero version", strings.Replace(valid, `"version":3`, `"version":0`, 1), contract.CodeInvalidVersion},
		{"invalid utf8", strings.Replace(valid, "Intro", "Intr\xff", 1), contract.CodeInvalidUTF8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := contract.DecodeEvent([]byte(tt.data))
			var ve *contract.ValidationError
			if !errors.As(err, &ve) || ve.Code != tt.code {
				t.Fatalf("err = %v, want code %s", err, tt.code)
			}
		})
	}
}

func FuzzDecodeEvent(f *testing.F) {
	f.Add(mustEncodeF(f, sampleEvent(f)))
	f.Add(mustEncodeF(f, contract.NewWithdrawnEvent("k", 1)))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"schema":"converge.event.v1","kind":"document.upserted","key":"k","version":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		ev, err := contract.DecodeEvent(data)
		if err != nil {
			var ve *contract.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("decode error is not a ValidationError: %T %v", err, err)
			}
			return
		}
		// Whatever decodes must verify, re-encode canonically and decode
		// to the same bytes again.
		enc, err := ev.Encode()
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		ev2, err := contract.DecodeEvent(enc)
		if err != nil {
			t.Fatalf("re-decode of canonical form failed: %v\n%s", err, enc)
		}
		enc2, _ := ev2.Encode()
		if !bytes.Equal(enc, enc2) {
			t.Fatalf("canonical encoding unstable:\n%s\n%s", enc, enc2)
		}
		if ev.ID != contract.EventID(ev.Key, ev.Version, ev.Kind) {
			t.Fatal("decoded event with a foreign id")
		}
	})
}

func mustEncodeF(f *testing.F, e contract.Event) []byte {
	b, err := e.Encode()
	if err != nil {
		f.Fatal(err)
	}
	return b
}

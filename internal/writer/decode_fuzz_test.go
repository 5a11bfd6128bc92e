package writer

import (
	"errors"
	"testing"

	"github.com/converge-sync/converge/pkg/contract"
)

// FuzzDecodeWrite feeds arbitrary request bodies and NDJSON lines to the
// decoder: it must never panic, every rejection must be a ValidationError
// with a code, and whatever it accepts must either normalise or be
// rejected by the contract with a code.
func FuzzDecodeWrite(f *testing.F) {
	for _, s := range []string{
		`{"key":"a","version":1,"title":"t","body":"b","links":["x"],"tags":["y"],"meta":{"k":1}}`,
		`{"key":"a","version":2,"withdrawn":true}`,
		`{"version":9223372036854775807}`,
		`{"version":1e3}`,
		`{"key":"","version":1}`,
		`{"key":"a\u0000","version":1,"meta":{"z":[{"a":null}]}}`,
		`[]`,
		``,
	} {
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, data []byte, allowWithdraw bool) {
		w, err := decodeWrite(data, "", allowWithdraw)
		if err != nil {
			var ve *contract.ValidationError
			if !errors.As(err, &ve) || ve.Code == "" {
				t.Fatalf("rejection without a code: %T %v", err, err)
			}
			return
		}
		if w.Doc.Version <= 0 || w.Doc.Key == "" {
			t.Fatalf("accepted without key or positive version: %+v", w.Doc)
		}
		if w.Withdraw {
			if !allowWithdraw {
				t.Fatal("withdrawal accepted where it is not allowed")
			}
			return
		}
		if _, err := w.Doc.Normalize(); err != nil {
			var ve *contract.ValidationError
			if !errors.As(err, &ve) || ve.Code == "" {
				t.Fatalf("normalise rejection without a code: %T %v", err, err)
			}
		}
	})
}

// FuzzDecodeReemitRequest: the re-emission request decoder never panics,
// rejects with a coded ValidationError, and accepts only a request it can
// serve: valid keys within the limit, or all with a limit in range.
func FuzzDecodeReemitRequest(f *testing.F) {
	for _, s := range []string{
		`{"keys":["a","b"]}`,
		`{"all":true,"after":"k","limit":10}`,
		`{"all":true}`,
		`{"keys":[]}`,
		`{"keys":["a"],"all":true}`,
		`{"all":true,"limit":5001}`,
		`{"keys":[""]}`,
		`{}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := decodeReemitRequest(data)
		if err != nil {
			var ve *contract.ValidationError
			if !errors.As(err, &ve) || ve.Code == "" {
				t.Fatalf("rejection without a code: %T %v", err, err)
			}
			return
		}
		if req.All && len(req.Keys) > 0 || !req.All && req.Keys == nil {
			t.Fatalf("accepted neither or both: %+v", req)
		}
		if req.All && (req.Limit < 1 || req.Limit > MaxReemitKeys) {
			t.Fatalf("accepted limit %d", req.Limit)
		}
		if len(req.Keys) > MaxReemitKeys {
			t.Fatalf("accepted %d keys", len(req.Keys))
		}
		for _, k := range req.Keys {
			if contract.ValidateKey(k) != nil {
				t.Fatalf("accepted key %q", k)
			}
		}
	})
}

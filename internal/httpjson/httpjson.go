// Package httpjson writes the JSON responses of converge's HTTP APIs, and
// their errors in the one shape every API uses:
// {"error":{"code":"...","message":"..."}}.
package httpjson

import (
	"encoding/json"
	"net/http"
)

// ErrorBody is the inner object of an error response.
type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Write writes v as JSON with the status.
func Write(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// Error writes an error response: code names the problem for programs,
// message explains it to people.
func Error(w http.ResponseWriter, status int, code, message string) {
	Write(w, status, map[string]ErrorBody{"error": {Code: code, Message: message}})
}

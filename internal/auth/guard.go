package auth

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/converge-sync/converge/internal/httpjson"
)

// Reasons of a refusal, the values of the reason label of
// converge_auth_refusals_total.
const (
	ReasonNoToken      = "no_token"      // 401: no bearer token
	ReasonUnknownToken = "unknown_token" // 401: a token not in the file
	ReasonScope        = "scope"         // 403: a known token without the route's scope
)

// Guard checks the bearer token of each request against Tokens.
type Guard struct {
	tokens  *Tokens
	refused *prometheus.CounterVec
	log     *slog.Logger
}

// NewGuard returns a guard over tokens (nil: authentication off). It
// counts refusals on reg (nil: not exported) and logs them on log (nil:
// not logged), naming the route and the token's name, never the token.
func NewGuard(tokens *Tokens, reg prometheus.Registerer, log *slog.Logger) *Guard {
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "converge_auth_refusals_total",
		Help: "Requests refused for their bearer token, by reason (no_token, unknown_token, scope) and route.",
	}, []string{"reason", "route"})
	if r, ok := reg.(*prometheus.Registry); ok && r == nil {
		reg = nil
	}
	if reg != nil {
		if err := reg.Register(refused); err != nil {
			// A second guard on the registry counts on the first one's
			// counter.
			var are prometheus.AlreadyRegisteredError
			existing, ok := refused, false
			if errors.As(err, &are) {
				existing, ok = are.ExistingCollector.(*prometheus.CounterVec)
			}
			if !ok {
				panic(err)
			}
			refused = existing
		}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Guard{tokens: tokens, refused: refused, log: log}
}

// Enabled reports whether requests are checked.
func (g *Guard) Enabled() bool { return g != nil && g.tokens.Enabled() }

// Require serves next only to a request whose bearer token holds scope;
// with several scopes in scope (Read|Write), any one of them will do. A
// request without a known token is answered 401 unauthorized, one whose
// token lacks the scope 403 forbidden, both in the APIs' error shape.
// With authentication off, every request is served.
func (g *Guard) Require(scope Scope, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.Enabled() {
			next.ServeHTTP(w, r)
			return
		}
		name, scopes, reason := g.decide(r, scope)
		switch reason {
		case "":
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), nameKey{}, name)))
		case ReasonNoToken:
			g.refuse(w, r, reason, "")
			w.Header().Set("WWW-Authenticate", `Bearer realm="converge"`)
			httpjson.Error(w, http.StatusUnauthorized, "unauthorized", "this route needs a bearer token (Authorization: Bearer <token>)")
		case ReasonUnknownToken:
			g.refuse(w, r, reason, "")
			w.Header().Set("WWW-Authenticate", `Bearer realm="converge", error="invalid_token"`)
			httpjson.Error(w, http.StatusUnauthorized, "unauthorized", "the bearer token is not one this service accepts")
		default:
			g.refuse(w, r, reason, name)
			w.Header().Set("WWW-Authenticate", `Bearer realm="converge", error="insufficient_scope", scope="`+scopeList(scope)+`"`)
			httpjson.Error(w, http.StatusForbidden, "forbidden",
				"the token "+name+" has the scopes "+scopes.String()+"; this route needs "+scopeAlternatives(scope))
		}
	})
}

// decide is whether r's token holds scope: the token's name and scopes,
// and the reason of a refusal ("" when allowed).
func (g *Guard) decide(r *http.Request, scope Scope) (name string, scopes Scope, reason string) {
	token, ok := bearer(r)
	if !ok {
		return "", 0, ReasonNoToken
	}
	name, scopes, ok = g.tokens.lookup(token)
	switch {
	case !ok:
		return "", 0, ReasonUnknownToken
	case scopes&scope == 0:
		return name, scopes, ReasonScope
	}
	return name, scopes, ""
}

// Allows reports whether Require(scope) would serve r, without counting
// or logging a refusal: what a page asks to show or hide an action.
func (g *Guard) Allows(r *http.Request, scope Scope) bool {
	if !g.Enabled() {
		return true
	}
	_, _, reason := g.decide(r, scope)
	return reason == ""
}

func (g *Guard) refuse(w http.ResponseWriter, r *http.Request, reason, name string) {
	route := r.Pattern
	if route == "" {
		route = "unrouted"
	}
	g.refused.WithLabelValues(reason, route).Inc()
	attrs := []any{"reason", reason, "route", route, "remote", r.RemoteAddr}
	if name != "" {
		// A known client lacking a scope is a misconfiguration worth seeing.
		g.log.WarnContext(r.Context(), "request refused", append(attrs, "token_name", name)...)
		return
	}
	g.log.DebugContext(r.Context(), "request refused", attrs...)
}

// bearer returns the request's bearer token.
func bearer(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

func scopeList(s Scope) string { return strings.ReplaceAll(s.String(), ",", " ") }

func scopeAlternatives(s Scope) string { return strings.ReplaceAll(s.String(), ",", " or ") }

type nameKey struct{}

// Name is the name of the token that authenticated the request of ctx, ""
// when authentication is off.
func Name(ctx context.Context) string {
	name, _ := ctx.Value(nameKey{}).(string)
	return name
}

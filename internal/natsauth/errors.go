package natsauth

import (
	"errors"
	"log/slog"
	"regexp"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// Violation is a refusal the server reported: Op ("Publish",
// "Subscription" or "Publish with Reply") on Subject.
type Violation struct {
	Op      string
	Subject string
}

var violationRe = regexp.MustCompile(`Permissions Violation for (Publish with Reply of|Publish to|Subscription to) "([^"]*)"`)

// ParseViolation reports whether err is a permission violation reported by
// the server, and which.
func ParseViolation(err error) (Violation, bool) {
	if err == nil || !errors.Is(err, nats.ErrPermissionViolation) {
		return Violation{}, false
	}
	m := violationRe.FindStringSubmatch(err.Error())
	if m == nil {
		return Violation{Op: "unknown"}, true
	}
	op := map[string]string{"Publish to": "Publish", "Subscription to": "Subscription", "Publish with Reply of": "Publish with Reply"}[m[1]]
	return Violation{Op: op, Subject: m[2]}, true
}

// DeniedCounter is converge_nats_permission_violations_total, registered
// on reg (when not nil): the refusals [ErrorHandler] counts.
func DeniedCounter(reg prometheus.Registerer) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "converge_nats_permission_violations_total",
		Help: "Publishes and subscriptions the NATS server refused to this process (its user lacks the permission).",
	})
	if reg != nil {
		reg.MustRegister(c)
	}
	return c
}

// ErrorHandler is a connection's asynchronous error handler
// (nats.ErrorHandler): a permission violation is logged at error level
// with its subject and counted by denied (when not nil); any other error
// (a slow consumer, say) is logged as a warning.
func ErrorHandler(log *slog.Logger, denied prometheus.Counter) nats.ErrHandler {
	return func(nc *nats.Conn, sub *nats.Subscription, err error) {
		attrs := []any{"err", err}
		if nc != nil {
			attrs = append(attrs, "connection", nc.Opts.Name)
		}
		if sub != nil {
			attrs = append(attrs, "subscription", sub.Subject)
		}
		if v, ok := ParseViolation(err); ok {
			if denied != nil {
				denied.Inc()
			}
			log.Error("nats refused: permission denied", append([]any{"operation", v.Op, "subject", v.Subject}, attrs...)...)
			return
		}
		log.Warn("nats asynchronous error", attrs...)
	}
}

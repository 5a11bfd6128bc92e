// Package natsauth is who may do what on NATS: one user per converge
// service, each allowed the subjects its code uses and nothing else, so that
// the single-writer shape of the pipeline is enforced by the server and not
// only agreed.
//
// The permission sets ([Relay], [Projector], [Notifier], [Writer],
// [Producer], [Operator]) are allow lists of subjects, JetStream's API
// included: a JetStream request is a publish to $JS.API.<verb>.<stream>...,
// an acknowledgement a publish to the message's $JS.ACK... reply subject, a
// key-value write a publish to $KV.<bucket>.<key> and a key-value read a
// direct get $JS.API.DIRECT.GET.KV_<bucket>.$KV.<bucket>.<key>. Every user
// subscribes to its own inboxes alone, [InboxPrefix](user).> (_INBOX_relay.>
// for the relay): replies, pull deliveries, key-value answers and the
// acknowledgements of its publishes come there, and no user can read
// another's. [ClientConfig.Options] gives a user's connection that prefix.
//
// [Users] makes the users of the embedded server (natsserver.StartWith);
// deploy/nats/converge.conf holds the same users for the docker-compose
// stack, and a test parses it with the server's own parser and compares.
//
// A refusal reaches the client as an asynchronous error (the server's
// -ERR 'Permissions Violation for Publish to "..."'); a JetStream call whose
// request was refused gets no answer and ends with its context.
// [ErrorHandler] logs each refusal at error level, naming the subject, and
// counts it. [ClientConfig] and [Flags] are a service's credentials.
package natsauth

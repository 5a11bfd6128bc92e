// Package console is the operator's console: one web page, served by
// `converge console`, that shows the pipeline as a picture with the lag
// and the rate at every stage (the relay's slot, the streams, each
// consumer, each store), how much of each store the continuous verifier
// has proven in agreement and the differences it named, the dead letters
// with their reasons and payloads, who holds each lease and partition,
// and the rebuilds running with their progress.
//
// The console writes nothing of its own. It reads what `converge status`
// and `converge dlq` read (Postgres's slot and outbox, the streams and
// their consumers, the dead-letter stream, the rebuilds' bucket), the
// services' /metrics, the projectors' rebuild status and the verifier's
// /v1/verify/status, once every interval whoever looks; the page polls the
// last reading. Its one action is a redrive of dead letters, which is
// [deadletter.Queue.Redrive] as `converge dlq redrive` runs it: the
// documents' dead letters re-emitted through the writer, the ingest ones
// republished, each deleted only once its redrive was acknowledged.
//
// Reading needs a token with the read scope, a redrive one with the admin
// scope; the page itself holds no data and is served to anyone, and asks
// for the token.
package console

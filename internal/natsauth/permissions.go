package natsauth

import (
	"slices"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/lease"
	"github.com/converge-sync/converge/pkg/contract"
)

// Names of JetStream objects whose owners (internal/writer, internal/rebuild,
// internal/notifier) import internal/service, which imports this package:
// they are repeated here, and TestNamesAreTheOwners pins each to its
// owner's constant.
const (
	// IngestStream is writer.IngestStream.
	IngestStream = "CONVERGE_INGEST"
	// IngestConsumer is writer.IngestConsumer.
	IngestConsumer = "converge-writer"
	// IngestDLQName is writer.IngestDLQName: the ingest consumer's dead
	// letters go to converge.dlq.ingest.
	IngestDLQName = "ingest"
	// RebuildBucket is rebuild.Bucket.
	RebuildBucket = "CONVERGE_REBUILDS"
	// PositionBucket is relay.PositionBucket: the relay's record of its
	// confirmed position.
	PositionBucket = contract.RelayBucket
	// NotifierBucket is notifier.DefaultBucket.
	NotifierBucket = "CONVERGE_EFFECTS"
	// NotifierName is the notifier's default durable consumer.
	NotifierName = "notifier"
)

// User names of the services.
const (
	UserRelay     = "relay"
	UserWriter    = "writer"
	UserIndex     = "projector-index"
	UserGraph     = "projector-graph"
	UserNotifier  = "notifier"
	UserProducer  = "producer"
	UserOperator  = "operator"
	projectorUser = "projector-"
)

// RebuildConsumer is rebuild.ConsumerName(name): the durable consumer of
// projector name's rebuilds.
func RebuildConsumer(name string) string { return name + "-rebuild" }

const api = "$JS.API."

// Relay may create the documents' stream, the effects' stream, its
// partitions, and the removals' stream (the server's advisories of what
// the effects' stream's limits took from a consumer, which the server
// itself publishes), and publish the streams' events: the only publisher
// of converge.docs.>, converge.events.> and converge.effects.> (the
// partitions'). Its bucket records, beside its positions, its move to the
// effects' partitions. It may not update either (a MaxMsgsPerSubject of 1
// or a short MaxAge removes what the consumers have not read, as a purge
// would): the operator does. It reads both streams' info (the effects'
// stream records where in the documents' stream it began), reads the
// documents' stream's newest message and each document's newest message
// (a catch-up publishes only what the stream lacks), and owns the bucket
// of its confirmed positions whole. It may not delete or purge a stream,
// nor touch a consumer.
func Relay() *server.Permissions {
	var parts []string
	for p := range contract.MaxPartitions {
		s := contract.EventsPartitionStream(p)
		parts = append(parts, api+"STREAM.CREATE."+s, api+"STREAM.INFO."+s)
	}
	return perms(UserRelay,
		[]string{api + "STREAM.CREATE." + contract.DocsStream, api + "STREAM.CREATE." + contract.EventsStream,
			api + "STREAM.CREATE." + contract.RemovalsStream},
		[]string{api + "STREAM.INFO." + contract.DocsStream, api + "STREAM.INFO." + contract.EventsStream,
			api + "STREAM.INFO." + contract.RemovalsStream},
		// A document's newest stored event, after which a catch-up
		// publishes its rows of the outbox.
		[]string{api + "DIRECT.GET." + contract.DocsStream, api + "DIRECT.GET." + contract.DocsStream + "." + contract.DocsSubjectPrefix + ">"},
		// The effects' partitions.
		parts,
		[]string{contract.DocsSubjectPrefix + ">", contract.EventsSubjectPrefix + ">", contract.EffectsSubjectPrefix + ">"},
		bucketCreate(PositionBucket),
		bucketKey(PositionBucket, ">"),
	)
}

// Projector, the user [ProjectorUser](name), may consume the documents'
// stream with its own durable consumer (name) and the rebuild consumer it
// creates (name-rebuild), which alone it may delete (and reset, resuming a
// rebuild); acknowledge their
// messages; dead-letter to converge.dlq.<name> and
// converge.dlq.<name>-rebuild; read the stream's info (a rebuild's
// target); and keep its own key, name, in the rebuilds' bucket. It holds
// its own lease, name, in the leases' bucket, and resets its own consumer
// when it takes the lease (what the previous instance held is delivered
// again). Run in partitions, it consumes the partitioned stream with its
// partitions' consumers (name-p00 to name-p15) and, rebuilding one
// partition, with its rebuild consumer (which it deletes and resets as on
// the documents' stream), dead-letters to theirs,
// holds their leases, its rebuilds' coordinator's (name.rebuild) and its
// members' keys (name.> in the leases' bucket) and watches its members (a
// push ordered consumer of those keys alone). It publishes nothing to converge.docs.> and reads no other
// consumer and no other bucket or key.
func Projector(name string) *server.Permissions {
	rb := RebuildConsumer(name)
	// The stream's info and, moving from one writer, its messages by
	// sequence (where the partitions start).
	parts := []string{api + "STREAM.INFO." + contract.PartsStream, api + "STREAM.MSG.GET." + contract.PartsStream}
	// A rebuild of one partition reads it with the rebuild consumer,
	// filtered to its subjects.
	parts = append(parts, consume(contract.PartsStream, rb)...)
	parts = append(parts, api+"CONSUMER.DELETE."+contract.PartsStream+"."+rb, api+"CONSUMER.RESET."+contract.PartsStream+"."+rb)
	dlq := []string{name, rb}
	for p := range contract.MaxPartitions {
		c := contract.PartitionName(name, p)
		parts = append(parts, consume(contract.PartsStream, c)...)
		parts = append(parts, api+"CONSUMER.RESET."+contract.PartsStream+"."+c)
		dlq = append(dlq, c)
	}
	return perms(ProjectorUser(name),
		[]string{api + "STREAM.INFO." + contract.DocsStream},
		consume(contract.DocsStream, name),
		leaseOf(contract.DocsStream, name),
		consume(contract.DocsStream, rb),
		[]string{api + "CONSUMER.DELETE." + contract.DocsStream + "." + rb, api + "CONSUMER.DELETE." + contract.DocsStream + "." + name,
			// A rebuild resumed by another instance has what the last
			// one held delivered again at once.
			api + "CONSUMER.RESET." + contract.DocsStream + "." + rb},
		deadLetters(dlq...),
		sharedBucketCreate(RebuildBucket),
		bucketKey(RebuildBucket, name),
		parts,
		partitionLeases(name),
	)
}

// partitionLeases: the keys name.> of the leases' bucket (the partitions'
// leases, the mark, the members) and the watch of name's members.
func partitionLeases(name string) []string {
	kv := "KV_" + lease.Bucket
	members := "$KV." + lease.Bucket + "." + name + ".members.*"
	return slices.Concat(bucketKey(lease.Bucket, name+".>"),
		// The watch's ordered consumer, deleted when the watch stops (the
		// server names it; any ephemeral consumer of the bucket's stream
		// could be named, which costs its watcher a new one).
		[]string{api + "CONSUMER.CREATE." + kv + ".*." + members, api + "CONSUMER.DELETE." + kv + ".*", "$JS.FC." + kv + ".>"})
}

// Notifier, the user notifier, may consume the effects' stream with its
// durable consumer (name), after reading the stream's info; read the
// removals' stream (what that stream's limits took from it); acknowledge,
// dead-letter to converge.dlq.<name>, own its dedup bucket whole, and hold
// its lease (as a projector does). On the documents' stream it may finish
// and delete its own consumer of an older deployment (notifier.Migrate),
// and nothing else. Run in partitions, it consumes each effects'
// partition with its consumer (name-p00 to name-p15), dead-letters to
// theirs, holds their leases and its members' keys as a partitioned
// projector does, and, moving to them, reads the relay's record of its
// move (one key of the relay's bucket) and deletes its consumer of the
// effects' stream.
func Notifier(name, bucket string) *server.Permissions {
	var parts, dlq []string
	for p := range contract.MaxPartitions {
		s, c := contract.EventsPartitionStream(p), contract.PartitionName(name, p)
		parts = append(parts, api+"STREAM.INFO."+s, api+"CONSUMER.RESET."+s+"."+c)
		parts = append(parts, consume(s, c)...)
		dlq = append(dlq, c)
	}
	return perms(UserNotifier,
		parts,
		deadLetters(dlq...),
		partitionLeases(name),
		// The move: the relay's record of it, and the delete of the
		// finished consumer of the effects' stream.
		[]string{api + "STREAM.INFO.KV_" + PositionBucket,
			api + "DIRECT.GET.KV_" + PositionBucket + ".$KV." + PositionBucket + "." + contract.EffectsMovedKey,
			api + "CONSUMER.DELETE." + contract.EventsStream + "." + name},
		[]string{api + "STREAM.INFO." + contract.EventsStream},
		consume(contract.EventsStream, name),
		// The server's record of the events the stream's limits took
		// from it, read by sequence.
		[]string{api + "STREAM.INFO." + contract.RemovalsStream, api + "STREAM.MSG.GET." + contract.RemovalsStream},
		leaseOf(contract.EventsStream, name),
		consume(contract.DocsStream, name),
		[]string{api + "CONSUMER.DELETE." + contract.DocsStream + "." + name},
		deadLetters(name),
		bucketCreate(bucket),
		bucketKey(bucket, ">"),
	)
}

// Writer may ensure the ingest stream, consume it with its durable
// consumer, acknowledge, and dead-letter to converge.dlq.ingest. Its other
// output is Postgres: it publishes nothing to converge.docs.>.
func Writer() *server.Permissions {
	cons := IngestStream + "." + IngestConsumer
	return perms(UserWriter,
		streamWrite(IngestStream),
		[]string{
			// The ingest consumer has no filter: its create request
			// carries none in the subject.
			api + "CONSUMER.CREATE." + cons,
			api + "CONSUMER.MSG.NEXT." + cons,
			"$JS.ACK." + cons + ".>",
		},
		deadLetters(IngestDLQName),
	)
}

// Producer may publish documents to converge.ingest.> (the writer's queue
// path) and nothing else.
func Producer() *server.Permissions {
	return perms(UserProducer, []string{contract.IngestSubjectPrefix + ">"})
}

// Operator is converge's commands that use NATS: status (the streams'
// info, their consumers, the message an acknowledgement floor points at,
// the rebuilds in progress), replay (a consumer of the documents' stream
// deleted and created again at another start) and dlq (list, show: an
// ordered consumer of the dead letters; redrive: the republish and the
// delete). It may republish a dead letter to converge.ingest.>, and not to
// converge.docs.>: the relay alone publishes document events, so the
// redrive of a dead letter of CONVERGE_DOCS's consumers asks the writer
// (over HTTP) to re-emit the document, which the relay then publishes.
// streams apply creates or updates the streams and shared buckets that
// the services only create (the relay's two, the dead letters', the
// leases', the rebuilds'): the operator alone changes their settings.
func Operator() *server.Permissions {
	docs, events, ingest, dlq := contract.DocsStream, contract.EventsStream, IngestStream, deadletter.Stream
	kv := "KV_" + RebuildBucket
	p := []string{
		// status: the streams' info, and the message at a consumer's
		// acknowledgement floor (not of the effects' stream, a work queue
		// that keeps none); dlq: the dead letters by sequence and
		// subject. The documents' stream allows direct gets (the relay's
		// configuration), which its readers use; the others do not.
		api + "STREAM.INFO." + docs, api + "STREAM.INFO." + events, api + "STREAM.INFO." + ingest, api + "STREAM.INFO." + dlq,
		api + "DIRECT.GET." + docs, api + "STREAM.MSG.GET." + ingest, api + "STREAM.MSG.GET." + dlq,
	}
	for _, s := range []string{docs, events, ingest} {
		p = append(p, api+"CONSUMER.LIST."+s)
	}
	parts := contract.PartsStream
	p = append(p,
		// replay: any consumer of the documents' stream, and of the
		// partitioned stream.
		api+"CONSUMER.INFO."+docs+".*",
		api+"CONSUMER.DELETE."+docs+".*",
		api+"CONSUMER.CREATE."+docs+".*.>",
		api+"STREAM.INFO."+parts,
		// status: the partitions' consumers, the message at each one's
		// floor, and who holds each partition's lease.
		api+"CONSUMER.LIST."+parts,
		api+"STREAM.MSG.GET."+parts,
		api+"STREAM.INFO.KV_"+lease.Bucket,
		api+"DIRECT.GET.KV_"+lease.Bucket+".$KV."+lease.Bucket+".*.*",
		api+"CONSUMER.INFO."+parts+".*",
		api+"CONSUMER.DELETE."+parts+".*",
		api+"CONSUMER.CREATE."+parts+".*.>",
		// dlq: ordered consumers (random names) of the dead letters.
		api+"CONSUMER.CREATE."+dlq+".>",
		api+"CONSUMER.MSG.NEXT."+dlq+".*",
		api+"CONSUMER.DELETE."+dlq+".*",
		// redrive: the delete after the republish.
		api+"STREAM.MSG.DELETE."+dlq,
		contract.IngestSubjectPrefix+">",
		// status: the rebuilds' bucket, listed by a push ordered consumer
		// with flow control, and read.
		api+"STREAM.INFO."+kv,
		api+"CONSUMER.CREATE."+kv+".>",
		api+"CONSUMER.DELETE."+kv+".*",
		"$JS.FC."+kv+".>",
		api+"DIRECT.GET."+kv+".>",
		// status: the relay's last catch-up after a Postgres failover.
		api+"STREAM.INFO.KV_"+PositionBucket,
		api+"DIRECT.GET.KV_"+PositionBucket+".$KV."+PositionBucket+".*.catchup",
	)
	// streams apply.
	for _, s := range []string{docs, events, contract.RemovalsStream, dlq, "KV_" + lease.Bucket, kv, parts} {
		p = append(p, streamWrite(s)...)
	}
	// streams apply -repartition.
	p = append(p, api+"STREAM.DELETE."+parts)
	// The effects' partitions: status reads them and their consumers;
	// streams apply makes them, and with -repartition deletes them once
	// they are empty.
	for part := range contract.MaxPartitions {
		s := contract.EventsPartitionStream(part)
		p = append(p, api+"STREAM.INFO."+s, api+"CONSUMER.LIST."+s, api+"STREAM.DELETE."+s)
		p = append(p, streamWrite(s)...)
	}
	return perms(UserOperator, p)
}

// leaseOf: hold lease name (its key in the shared leases' bucket) and
// reset consumer name of stream when taking it.
func leaseOf(stream, name string) []string {
	return slices.Concat(sharedBucketCreate(lease.Bucket), bucketKey(lease.Bucket, name),
		[]string{api + "CONSUMER.RESET." + stream + "." + name})
}

// streamWrite: create the stream or update its configuration.
func streamWrite(stream string) []string {
	return []string{
		api + "STREAM.CREATE." + stream, api + "STREAM.UPDATE." + stream,
	}
}

// consume: create (with a filter subject), read and pull from consumer,
// unpin its previous client (a runtime starting), and acknowledge its
// messages.
func consume(stream, consumer string) []string {
	c := stream + "." + consumer
	return []string{
		api + "CONSUMER.CREATE." + c + ".>",
		api + "CONSUMER.INFO." + c,
		api + "CONSUMER.MSG.NEXT." + c,
		api + "CONSUMER.UNPIN." + c,
		"$JS.ACK." + c + ".>",
	}
}

// deadLetters: ensure the dead letters' stream and publish to the
// dead-letter subject of each consumer.
func deadLetters(consumers ...string) []string {
	// Create only: the stream is shared by every consumer, so none may
	// change its configuration (its retention) under the others; the
	// operator updates it.
	p := []string{api + "STREAM.CREATE." + deadletter.Stream}
	for _, c := range consumers {
		p = append(p, contract.DLQSubject(c))
	}
	return p
}

// bucketCreate: create or update a key-value bucket (its stream KV_<bucket>;
// creating one reads the account's JetStream limits first).
func bucketCreate(bucket string) []string {
	return append([]string{api + "INFO"}, streamWrite("KV_"+bucket)...)
}

// sharedBucketCreate: create a key-value bucket that several users share
// (the leases', the rebuilds'; internal/sharedkv, whose buckets refuse
// roll-ups), never update it: one user may not change another's
// retention.
func sharedBucketCreate(bucket string) []string {
	return []string{api + "STREAM.CREATE.KV_" + bucket, api + "STREAM.INFO.KV_" + bucket}
}

// bucketKey: put, update and delete key (a wildcard: keys) of bucket, and
// read it by a direct get of its last value.
func bucketKey(bucket, key string) []string {
	subject := "$KV." + bucket + "." + key
	return []string{subject, api + "DIRECT.GET.KV_" + bucket + "." + subject}
}

// perms is user's permission to publish to the union of pubs, and to
// subscribe to its own inboxes (see [InboxPrefix]) and nothing else.
func perms(user string, pubs ...[]string) *server.Permissions {
	var allow []string
	for _, p := range pubs {
		allow = append(allow, p...)
	}
	slices.Sort(allow)
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: slices.Compact(allow)},
		Subscribe: &server.SubjectPermission{Allow: []string{InboxPrefix(user) + ".>"}},
	}
}

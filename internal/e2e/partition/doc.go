// Package partition proves the lease's fencing across a real network
// partition: each writer of a shared store (the graph projector on
// Neo4j, the index projector on Qdrant, the notifier) runs twice, as
// processes, each instance's NATS link and store link through a proxy of
// its own (internal/netfault). The instance that writes is cut off from
// NATS while it and NATS keep running, with a store call of it in flight
// (the store's answers frozen across the cut); the other takes over. The
// proxies' taps decode what each instance sent its store (Bolt's
// transactions, Qdrant's gRPC methods) and the webhook receiver knows
// which process posted: nothing of the partitioned instance may reach the
// store after the takeover, and the stores must then agree with Postgres
// (converge verify, without repair).
//
// The package holds tests only, skipped with -short:
//
//	go test ./internal/e2e/partition -run TestFencingHoldsAcrossAPartition -v
//	                                     # one partition per service (make test)
//	CONVERGE_PARTITION_CUTS=5 go test ./internal/e2e/partition -v
//	                                     # five per service, random kinds and times; CONVERGE_PARTITION_SEED repeats one
//	CONVERGE_PARTITION_NOTIFIER_BACKLOG=1 go test ./internal/e2e/partition -run Backlog -v
//	                                     # the notifier's background sends after a takeover
//
// Neo4j and Qdrant are the test servers of testenv (LeaseNeo4j,
// LeaseQdrant): those of `make test`'s scripts, or started for the run.
package partition
